"""Which of a pin's locked files pip installs in an image, and what it unpacks to there,
read from the index without downloading the wheels.

pip installs the wheel whose tags rank first for the image's interpreter and platform
(packaging.tags gives pip's order), and builds the sdist only when no wheel fits.

A wheel is a zip (PEP 427) whose central directory, at its end, lists every member's
uncompressed size: it is read over HTTP range requests, a few kilobytes to a few megabytes
fetched, never the whole file (pip's fast-deps reads a wheel's metadata the same way: pip
src/pip/_internal/network/lazy_wheel.py). An sdist (DeepSpeed's, built in the image) is a
gzipped tar with no directory, so it is streamed; the lock's sdists are a few megabytes.
What pip leaves on disk is the members plus the bytecode it compiles for every module
(`pip install` compiles by default; the images' Dockerfile does not turn it off).
"""

from __future__ import annotations

import io
import tarfile
import urllib.request
import zipfile
from collections.abc import Callable

from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import parse_wheel_filename

# .pyc bytes per .py byte pip compiled: measured on the cu130 virtualenv installed from its
# lock with Python 3.12 (0.270 GB of .pyc for 0.221 GB of .py, 13,619 modules).
PYC_PER_SOURCE = 1.22


# manylinux's names before PEP 600, each the manylinux_2_<n> it equals (PEP 600).
_LEGACY_MANYLINUX = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}


def image_tags(python: str, glibc: str) -> list[Tag]:
    """The wheel tags CPython `python` accepts on x86_64 Linux with `glibc`, best first."""
    version = tuple(int(part) for part in python.split("."))
    major, newest = (int(part) for part in glibc.split("."))
    platforms = []
    for minor in range(newest, -1, -1):
        platforms.append(f"manylinux_{major}_{minor}_x86_64")
        if minor in _LEGACY_MANYLINUX:
            platforms.append(f"{_LEGACY_MANYLINUX[minor]}_x86_64")
    platforms.append("linux_x86_64")
    return [
        *cpython_tags(version, platforms=platforms),
        *compatible_tags(version, platforms=platforms),
    ]


def installed_file(files: list[dict], hashes: list[str], tags: list[Tag]) -> dict | None:
    """Of an index's `files` (PEP 691 entries), the one pip installs among those whose
    sha256 the lock pins: the best-ranked compatible wheel, else the sdist."""
    rank = {tag: position for position, tag in enumerate(tags)}
    locked = [f for f in files if f.get("hashes", {}).get("sha256") in hashes]
    wheels = []
    for entry in locked:
        if entry["filename"].endswith(".whl"):
            ranks = [rank[t] for t in parse_wheel_filename(entry["filename"])[3] if t in rank]
            if ranks:
                wheels.append((min(ranks), entry))
    if wheels:
        return min(wheels, key=lambda ranked: ranked[0])[1]
    return next((f for f in locked if f["filename"].endswith((".tar.gz", ".zip"))), None)


class RangesRefused(Exception):
    """The server answered a range request with the whole file (not an OSError: zipfile
    would report that as "File is not a zip file")."""


class RangeFile(io.RawIOBase):
    """A read-only, seekable file over HTTP, each read one Range request (RFC 9110 14.2)."""

    def __init__(self, url: str, size: int, opener: Callable = urllib.request.urlopen):
        super().__init__()
        self._url, self._size, self._opener, self._position = url, size, opener, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        start = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: self._size}[whence]
        self._position = max(0, start + offset)
        return self._position

    def readinto(self, buffer) -> int:
        end = min(self._position + len(buffer), self._size)
        if end <= self._position:
            return 0
        request = urllib.request.Request(
            self._url, headers={"Range": f"bytes={self._position}-{end - 1}"}
        )
        with self._opener(request, timeout=60) as response:
            # 200 would be the whole file: a server that ignores ranges is not read whole.
            if response.status != 206:
                raise RangesRefused(
                    f"{self._url} answered a range request with HTTP {response.status}"
                )
            data = response.read(end - self._position)
        buffer[: len(data)] = data
        self._position += len(data)
        return len(data)


def installed_bytes(entry: dict, opener: Callable = urllib.request.urlopen) -> float:
    """Bytes the index file `entry` (PEP 691: url, size, filename) leaves on disk once pip
    installs it: its members, and bytecode for its modules."""
    if entry["filename"].endswith((".whl", ".zip")):
        with zipfile.ZipFile(RangeFile(entry["url"], entry["size"], opener)) as archive:
            members = [(m.filename, m.file_size) for m in archive.infolist()]
    else:
        with (
            opener(entry["url"], timeout=60) as response,
            tarfile.open(fileobj=response, mode="r|gz") as archive,
        ):
            members = [(m.name, m.size) for m in archive if m.isfile()]
    sources = sum(size for name, size in members if name.endswith(".py"))
    return sum(size for _, size in members) + PYC_PER_SOURCE * sources
