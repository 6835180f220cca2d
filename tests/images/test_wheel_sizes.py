"""Which locked file pip installs, checked against pip's own choice, and what a wheel or
sdist unpacks to, read through a real HTTP server's range support (werkzeug's send_file,
RFC 9110 range requests) and refused where a server ignores ranges (Python's http.server)."""

from __future__ import annotations

import functools
import hashlib
import http.server
import io
import os
import subprocess
import sys
import tarfile
import threading
import zipfile
from pathlib import Path

import pytest
from werkzeug.serving import make_server
from werkzeug.utils import send_file
from werkzeug.wrappers import Request

from images import wheel_sizes

MODULE = b"def f():\n    return 1\n" * 400  # 8,800 bytes of Python
PAYLOAD = os.urandom(1 << 20)  # a library: incompressible
ZEROS = bytes(3 << 20)  # data that compresses to almost nothing


def write_wheel(folder: Path, filename: str) -> Path:
    """A wheel pip accepts: a module, two data files and its dist-info."""
    name, version = filename.split("-")[:2]
    dist_info = f"{name}-{version}.dist-info"
    path = folder / filename
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as wheel:
        wheel.writestr(f"{name}/__init__.py", MODULE)
        wheel.writestr(f"{name}/lib.so", PAYLOAD)
        wheel.writestr(f"{name}/zeros.bin", ZEROS)
        wheel.writestr(
            f"{dist_info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
        )
        tag = filename.removesuffix(".whl").split("-", 2)[2]
        wheel.writestr(
            f"{dist_info}/WHEEL", f"Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: {tag}\n"
        )
        wheel.writestr(f"{dist_info}/RECORD", "")
    return path


def unpacked(path: Path) -> int:
    """The members' sizes as the archive module itself reads them, whole file at hand."""
    if path.suffix == ".whl":
        with zipfile.ZipFile(path) as archive:
            return sum(m.file_size for m in archive.infolist())
    with tarfile.open(path) as archive:
        return sum(m.size for m in archive.getmembers() if m.isfile())


def entry(path: Path, url: str) -> dict:
    """The file as PyPI's JSON simple API lists it (PEP 691, size per PEP 700)."""
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    return {
        "filename": path.name,
        "url": url,
        "size": path.stat().st_size,
        "hashes": {"sha256": digest},
    }


@pytest.fixture
def ranged_server(tmp_path):
    """Serves tmp_path with werkzeug's range support; yields (base URL, bytes sent so far)."""
    sent = []

    def app(environ, start_response):
        request = Request(environ)
        response = send_file(tmp_path / request.path.lstrip("/"), environ, conditional=True)
        sent.append(response.content_length or 0)
        return response(environ, start_response)

    server = make_server("127.0.0.1", 0, app, threaded=True)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}", sent
    server.shutdown()


def test_a_wheels_unpacked_size_comes_from_its_zip_directory_not_a_download(
    tmp_path, ranged_server
):
    base, sent = ranged_server
    wheel = write_wheel(tmp_path, "lib-1.0-cp312-cp312-manylinux_2_28_x86_64.whl")
    size = wheel_sizes.installed_bytes(entry(wheel, f"{base}/{wheel.name}"))
    # The members as unpacked, plus the bytecode pip compiles for the one module.
    assert size == pytest.approx(unpacked(wheel) + wheel_sizes.PYC_PER_SOURCE * len(MODULE))
    assert unpacked(wheel) > len(PAYLOAD) + len(ZEROS) > wheel.stat().st_size
    assert sum(sent) < 0.01 * wheel.stat().st_size  # the directory, not the 1 MiB file


def test_an_sdist_is_streamed_and_its_members_counted(tmp_path, ranged_server):
    base, _ = ranged_server
    sdist = tmp_path / "lib-1.0.tar.gz"
    with tarfile.open(sdist, "w:gz") as archive:
        for name, data in [("lib-1.0/lib/__init__.py", MODULE), ("lib-1.0/data.bin", ZEROS)]:
            member = tarfile.TarInfo(name)
            member.size = len(data)
            archive.addfile(member, io.BytesIO(data))
    size = wheel_sizes.installed_bytes(entry(sdist, f"{base}/{sdist.name}"))
    assert size == pytest.approx(unpacked(sdist) + wheel_sizes.PYC_PER_SOURCE * len(MODULE))


def test_a_server_that_ignores_ranges_is_refused_not_downloaded(tmp_path):
    wheel = write_wheel(tmp_path, "lib-1.0-py3-none-any.whl")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/{wheel.name}"
        with pytest.raises(
            wheel_sizes.RangesRefused, match=f"{url} answered a range request with HTTP 200"
        ):
            wheel_sizes.installed_bytes(entry(wheel, url))
    finally:
        server.shutdown()


FILES = [
    "lib-1.0-cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
    "lib-1.0-cp312-cp312-manylinux_2_28_x86_64.whl",
    "lib-1.0-cp312-cp312-manylinux_2_41_x86_64.whl",  # newer than any glibc here
    "lib-1.0-cp312-cp312-manylinux_2_28_aarch64.whl",
    "lib-1.0-cp312-cp312-musllinux_1_2_x86_64.whl",
    "lib-1.0-cp311-cp311-manylinux2014_x86_64.whl",
    "lib-1.0-cp313-cp313-manylinux_2_28_x86_64.whl",
    "lib-1.0-py3-none-any.whl",
]


def pips_choice(folder: Path) -> str:
    """The file pip, run by this interpreter on this machine, takes from `folder`."""
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--isolated", "--no-deps",
         "--no-index", "--find-links", str(folder), "--only-binary=:all:",
         "--dest", str(folder / "chosen"), "lib==1.0"],
        check=True, capture_output=True,
    )  # fmt: skip
    return next((folder / "chosen").iterdir()).name


def test_the_file_chosen_is_the_one_pip_installs_on_the_machine(tmp_path):
    paths = [write_wheel(tmp_path, name) for name in FILES]
    files = [entry(path, f"https://files.example/{path.name}") for path in paths]
    hashes = [f["hashes"]["sha256"] for f in files]
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    glibc = os.confstr("CS_GNU_LIBC_VERSION").split()[1]  # "glibc 2.36"
    chosen = wheel_sizes.installed_file(files, hashes, wheel_sizes.image_tags(python, glibc))
    assert chosen["filename"] == pips_choice(tmp_path)
    # Another interpreter's wheel ranks first for that interpreter.
    chosen = wheel_sizes.installed_file(files, hashes, wheel_sizes.image_tags("3.13", glibc))
    assert chosen["filename"] == "lib-1.0-cp313-cp313-manylinux_2_28_x86_64.whl"


def test_without_a_wheel_that_fits_pip_builds_the_sdist_and_unlocked_files_are_not_chosen():
    tags = wheel_sizes.image_tags("3.12", "2.39")
    aarch64 = {
        "filename": "lib-1.0-cp312-cp312-manylinux_2_28_aarch64.whl",
        "hashes": {"sha256": "a"},
    }
    sdist = {"filename": "lib-1.0.tar.gz", "hashes": {"sha256": "s"}}
    fitting = {"filename": "lib-1.0-py3-none-any.whl", "hashes": {"sha256": "w"}}
    assert wheel_sizes.installed_file([aarch64, sdist, fitting], ["a", "s"], tags) == sdist
    assert wheel_sizes.installed_file([aarch64, fitting], ["a"], tags) is None
