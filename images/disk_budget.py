"""`python -m images disk-budget <variant>`: what building the image needs on disk, computed
before anything is pulled, against what the machine has free.

The figures come from the registries, not from guesses about them: each base image's
compressed layer sizes from its manifest (`docker buildx imagetools inspect --raw`); for
each pin, the file pip installs in the image (of those whose sha256 the lock pins) with
its size from PyPI's JSON API and what it unpacks to from its own zip directory
(images/wheel_sizes.py). Where a figure cannot be read (no docker, a wheel that is not on
PyPI such as torch's +cpu build) it is named and counted as 0, so the budget is a floor.

A buildx build into the runner's Docker (docker-container driver) holds, at its peak:
- both bases in BuildKit, compressed (its content store keeps the pulled blobs) and
  unpacked (its snapshots), and the runtime base unpacked once more in Docker's store
  after `--load`;
- the wheels pip downloaded;
- the virtualenv three times unpacked: the build stage, the runtime stage, Docker's copy
  (once in the build stage: the Dockerfile splits it into its layers in the step that
  installs it, where mv renames; a later step's mv would copy it);
- the runtime image's layers compressed, which BuildKit writes to its content store to
  export the image (`--load`, or a push); the virtualenv compresses about as its wheels
  did, so the wheels' size stands for it;
- with `--cache-to ...,mode=max`, every stage's layers compressed for the cache export:
  the build stage's virtualenv once more, again about the wheels' size.
`main` prints the figure, and given the disk use sampled during the build (`--peak-log`)
checks it against the measured peak: a budget below what a build used fails, so the model
is corrected instead of trusted.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tarfile
import urllib.request
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from packaging.tags import Tag

from images import locks, wheel_sizes
from images.matrix import Matrix, Variant

GB = 1e9
# Unpacked / compressed size of a CUDA base: nvidia/cuda:11.8.0-devel is 2.92 GB compressed
# and 7.37 GB unpacked (Docker Hub tag page); CUDA libraries compress alike across releases.
UNPACKED_PER_COMPRESSED = 7.37 / 2.92
AMD64 = {"architecture": "amd64", "os": "linux"}


@dataclass(frozen=True)
class Budget:
    base_build: float  # compressed bytes
    base_runtime: float
    wheels: float  # downloaded bytes
    venv: float  # installed bytes
    unknown: tuple[str, ...]  # figures that could not be read (counted as 0)
    cache_write: bool = False  # the build also exports a mode=max registry cache

    def rows(self) -> list[tuple[str, float]]:
        bases = self.base_build + self.base_runtime
        rows = [
            ("bases, compressed (BuildKit's content store)", bases),
            ("bases, unpacked (BuildKit)", bases * UNPACKED_PER_COMPRESSED),
            (
                "base_runtime, unpacked (Docker, --load)",
                self.base_runtime * UNPACKED_PER_COMPRESSED,
            ),
            ("wheels downloaded", self.wheels),
            ("virtualenv x3 (build, runtime, --load)", 3 * self.venv),
            ("image layers compressed for the export", self.wheels),
        ]
        if self.cache_write:
            rows.append(("build stage compressed for the cache export", self.wheels))
        return rows

    @property
    def needed(self) -> float:
        return sum(size for _, size in self.rows())

    def lines(self) -> list[str]:
        out = [f"  {name:<48}{size / GB:7.1f} GB" for name, size in self.rows()]
        out.append(f"  {'needed':<48}{self.needed / GB:7.1f} GB")
        out += [f"  (not counted: {name})" for name in self.unknown]
        return out


def _inspect_raw(reference: str) -> dict:
    argv = ["docker", "buildx", "imagetools", "inspect", "--raw", reference]
    return json.loads(subprocess.run(argv, capture_output=True, text=True, check=True).stdout)


def image_size(reference: str, inspect: Callable[[str], dict] = _inspect_raw) -> float:
    """Compressed bytes of the linux/amd64 image `reference` names (an index or a manifest)."""
    manifest = inspect(reference)
    if "manifests" in manifest:
        entry = next(
            m
            for m in manifest["manifests"]
            if all(m.get("platform", {}).get(key) == value for key, value in AMD64.items())
        )
        manifest = inspect(f"{reference.split(':')[0]}@{entry['digest']}")
    return float(sum(layer["size"] for layer in manifest["layers"]))


SIMPLE_JSON = "application/vnd.pypi.simple.v1+json"


def _pypi_files(name: str) -> list[dict]:
    """The project's files with their sha256 and size: PyPI's JSON simple API (PEP 691,
    sizes per PEP 700)."""
    request = urllib.request.Request(
        f"https://pypi.org/simple/{locks.normalize(name)}/", headers={"Accept": SIMPLE_JSON}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.load(response)["files"]


def wheel_bytes(
    lock: locks.Lock,
    tags: list[Tag],
    files: Callable[[str], list[dict]] = _pypi_files,
    unpacked: Callable[[dict], float] = wheel_sizes.installed_bytes,
) -> tuple[float, float, list[str]]:
    """Downloaded and installed bytes of what the lock installs on a machine that accepts
    `tags`; the pins whose sizes the index does not give."""

    def sizes(pin: locks.Pin) -> tuple[float, float] | None:
        try:
            entry = wheel_sizes.installed_file(files(pin.name), pin.hashes, tags)
            return None if entry is None else (entry["size"], unpacked(entry))
        except (OSError, zipfile.BadZipFile, tarfile.TarError, wheel_sizes.RangesRefused):
            return None

    downloaded, installed, unknown = 0.0, 0.0, []
    for pin in lock.pins.values():  # one index request and about three range requests each
        found = sizes(pin)
        if found is None:
            unknown.append(f"{pin.name}=={pin.version}")
            continue
        downloaded += found[0]
        installed += found[1]
    return downloaded, installed, unknown


def budget(
    variant: Variant,
    glibc: str,
    inspect=_inspect_raw,
    files=_pypi_files,
    unpacked=wheel_sizes.installed_bytes,
    *,
    cache_write: bool = False,
) -> Budget:
    """The build's disk figures for `variant`, whose base OS has `glibc`."""
    unknown: list[str] = []
    bases = []
    for base in (variant.base_build, variant.base_runtime):
        try:
            bases.append(image_size(base, inspect))
        except (OSError, subprocess.CalledProcessError, StopIteration, KeyError):
            bases.append(0.0)
            unknown.append(f"base image {base}")
    tags = wheel_sizes.image_tags(variant.python, glibc)
    lock = locks.read_lock(locks.lock_path(variant))
    wheels, venv, missing = wheel_bytes(lock, tags, files, unpacked)
    unknown += [f"wheel {name}" for name in missing]
    return Budget(bases[0], bases[1], wheels, venv, tuple(unknown), cache_write)


def peak_use(samples: list[int]) -> int:
    """Bytes a build added at its peak: the most used minus the first sample, taken before it
    started (`df -B1 --output=used` lines, one per sample)."""
    return max(samples) - samples[0] if samples else 0


def read_samples(log: Path) -> list[int]:
    return [int(line) for line in log.read_text().split() if line.isdigit()]


def main(
    matrix: Matrix,
    variant: Variant,
    paths: list[Path],
    *,
    cache_write: bool = False,
    peak_log: Path | None = None,
) -> int:
    """Print the budget and the free space; 1 when the first existing path has too little.
    With `peak_log`, print the build's measured peak instead, and 1 when it exceeded the
    budget (the model undercounts: fix it)."""
    plan = budget(variant, matrix.os_of(variant).glibc, cache_write=cache_write)
    where = next((path for path in paths if path.exists()), Path("/"))
    print(f"disk budget for {variant.name}:")
    print("\n".join(plan.lines()))
    if peak_log is not None:
        peak = peak_use(read_samples(peak_log))
        print(f"  {'peak disk use of the build on ' + str(where):<48}{peak / GB:7.1f} GB")
        if plan.unknown or peak <= plan.needed:
            return 0
        print(
            f"error: the {variant.name} build used {peak / GB:.1f} GB at its peak, more than "
            f"the {plan.needed / GB:.1f} GB budget: images/disk_budget.py undercounts"
        )
        return 1
    free = shutil.disk_usage(where).free
    print(f"  {'free on ' + str(where):<48}{free / GB:7.1f} GB")
    if free < plan.needed:
        print(
            f"error: the {variant.name} build needs about {plan.needed / GB:.1f} GB and {where} "
            f"has {free / GB:.1f} GB free: free more space or use a larger runner"
        )
        return 1
    return 0
