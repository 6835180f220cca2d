"""Image: the cpu image's size vs the sum of what it installs (images/locks/cpu.txt).

The image is never built here (that takes minutes and root). Its size is read from an
existing local build (`buildah images`) when there is one. What it installs is the lock's
distributions at their pinned versions, sized as installed: from this interpreter's
environment where it holds that version (the files each distribution's RECORD lists),
otherwise from the wheel's unpacked size (the sizes in its zip directory), fetched with
`pip download --no-deps` (the pip cache answers when it can).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

from bench.launch import REPO_ROOT
from bench.measure import metric
from images.build_args import IMAGE_NAME

TITLE = "Image size"
LOCK = REPO_ROOT / "images" / "locks" / "cpu.txt"
_PIN = re.compile(r"^([A-Za-z0-9_.\-]+)==([^\s\\;]+)", re.MULTILINE)


def run(quick: bool) -> dict:
    pins = dict(_PIN.findall(LOCK.read_text()))
    sizes, how = {}, {}
    for name, version in pins.items():
        installed = _installed_bytes(name, version)
        if installed is not None:
            sizes[name], how[name] = installed, "installed here"
    missing = [name for name in pins if name not in sizes]
    if missing and not quick:
        for name, size in _wheel_bytes({n: pins[n] for n in missing}).items():
            sizes[name], how[name] = size, "wheel, unpacked"
    total = sum(sizes.values())
    image = _built_image_bytes()
    biggest = sorted(sizes.items(), key=lambda item: -item[1])[:5]
    metrics = [
        metric(f"installed from the lock ({len(sizes)} of {len(pins)} distributions)",
               total / 2**20, "MiB", baseline_label="sum of installed sizes"),
    ]  # fmt: skip
    if image is not None:
        metrics.append(
            metric("cpu image", image / 2**20, "MiB", baseline=total / 2**20,
                   baseline_label="sum of what it installs", higher_is_better=False)
        )  # fmt: skip
    metrics += [
        metric(f"{name}=={pins[name]}", size / 2**20, "MiB", baseline=total / 2**20,
               baseline_label="share of the install", higher_is_better=False)
        for name, size in biggest
    ]  # fmt: skip
    unsized = [name for name in pins if name not in sizes]
    return {
        "baseline": "the sum of the installed sizes of the lock's distributions",
        "setup": f"{LOCK.relative_to(REPO_ROOT)}; image size "
        + ("from `buildah images`" if image is not None else "not available: no local build"),
        "metrics": metrics,
        "bytes": sizes,
        "sized_by": how,
        "image_bytes": image,
        "notes": [
            "image: "
            + (f"{image / 2**20:,.0f} MiB (buildah images)" if image else "no local build of "
               f"{IMAGE_NAME} (not built here): its size is not measured"),
            "sized as installed here: "
            f"{sum(1 for h in how.values() if h == 'installed here')}, from wheels: "
            f"{sum(1 for h in how.values() if h != 'installed here')}"
            + (f"; not sized: {', '.join(unsized)}" if unsized else ""),
            "the image adds the base (Debian and Python) to this sum",
        ],
    }  # fmt: skip


def _installed_bytes(name: str, version: str) -> int | None:
    try:
        dist = distribution(name)
    except PackageNotFoundError:
        return None
    if dist.version != version or not dist.files:
        return None
    total = 0
    for file in dist.files:
        path = Path(dist.locate_file(file))
        if path.is_file():
            total += path.stat().st_size
    return total


def _wheel_bytes(pins: dict[str, str]) -> dict[str, int]:
    folder = Path(tempfile.mkdtemp(prefix="bench-wheels-"))
    try:
        sizes = {}
        for name, version in pins.items():
            done = subprocess.run(
                [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                 "--disable-pip-version-check", "-d", str(folder / name), f"{name}=={version}"],
                capture_output=True, text=True, timeout=300,
            )  # fmt: skip
            wheels = list((folder / name).glob("*.whl"))
            if done.returncode == 0 and wheels:
                with zipfile.ZipFile(wheels[0]) as wheel:
                    sizes[name] = sum(info.file_size for info in wheel.infolist())
        return sizes
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _built_image_bytes() -> int | None:
    if shutil.which("buildah") is None:
        return None
    try:
        done = subprocess.run(
            ["buildah", "images", "--json"], capture_output=True, text=True, timeout=60
        )
    except subprocess.TimeoutExpired:  # the storage is locked by a build in progress
        return None
    if done.returncode != 0 or not done.stdout.strip():
        return None
    for image in json.loads(done.stdout):
        names = " ".join(image.get("names") or [])
        if IMAGE_NAME in names and "cpu" in names:
            return human_bytes(str(image.get("size") or ""))
    return None


def human_bytes(text: str) -> int | None:
    """Bytes from buildah's size ("1.23 GB": powers of 1000, three significant digits, as
    cmd/buildah/images.go formats it); None for anything else."""
    match = re.fullmatch(r"\s*([0-9.]+)\s*([kKMGT]?B)\s*", text)
    if match is None:
        return None
    power = "BKMGT".index(match.group(2)[0].upper())
    return round(float(match.group(1)) * 1000**power)
