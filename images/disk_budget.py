"""`python -m images disk-budget <variant>`: what building the image needs on disk, computed
before anything is pulled, against what the machine has free.

The figures come from the registries, not from guesses about them: each base image's
compressed layer sizes from its manifest (`docker buildx imagetools inspect --raw`), each
locked wheel's size from PyPI's JSON API (the file whose sha256 the lock pins). Where a
figure cannot be read (no docker, a wheel that is not on PyPI such as torch's +cpu build)
it is named and counted as 0, so the budget is a floor.

A buildx build into the runner's Docker (docker-container driver) holds, at its peak:
- both bases in BuildKit, compressed (its content store keeps the pulled blobs) and
  unpacked (its snapshots), and the runtime base unpacked once more in Docker's store
  after `--load`;
- the wheels pip downloaded;
- the virtualenv three times unpacked: the build stage, the runtime stage, Docker's copy;
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
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from images import locks
from images.matrix import Variant

GB = 1e9
# Unpacked / compressed size of a CUDA base: nvidia/cuda:11.8.0-devel is 2.92 GB compressed
# and 7.37 GB unpacked (Docker Hub tag page); CUDA libraries compress alike across releases.
UNPACKED_PER_COMPRESSED = 7.37 / 2.92
# Installed / downloaded size of a wheel, measured on the files themselves (sum of the zip's
# uncompressed sizes over the file's size): CUDA libraries barely compress (nvidia-cufft
# 12.0.0.61 x86_64: 214 MB -> 288 MB, 1.34; nvidia-nccl-cu13 2.29.7: 206 MB -> 237 MB,
# 1.15); other wheels do (torch 2.13.0+cpu: 192 MB -> 699 MB, 3.65). The larger of each.
INSTALLED_PER_CUDA_WHEEL = 1.34
INSTALLED_PER_OTHER_WHEEL = 3.65
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


def installed_per_byte(name: str) -> float:
    return (
        INSTALLED_PER_CUDA_WHEEL
        if name.startswith(("nvidia", "cuda"))
        else INSTALLED_PER_OTHER_WHEEL
    )


def wheel_bytes(
    lock: locks.Lock, files: Callable[[str], list[dict]] = _pypi_files
) -> tuple[float, float, list[str]]:
    """Downloaded and installed bytes of what the lock installs; the pins whose size the
    index does not give."""
    downloaded, installed, unknown = 0.0, 0.0, []
    for pin in lock.pins.values():
        try:
            listed = files(pin.name)
        except OSError:
            listed = []
        sizes = [f["size"] for f in listed if f.get("hashes", {}).get("sha256") in pin.hashes]
        if not sizes:
            unknown.append(f"{pin.name}=={pin.version}")
            continue
        size = max(sizes)  # one file per platform is installed; the largest bounds it
        downloaded += size
        installed += size * installed_per_byte(locks.normalize(pin.name))
    return downloaded, installed, unknown


def budget(
    variant: Variant, inspect=_inspect_raw, files=_pypi_files, *, cache_write: bool = False
) -> Budget:
    unknown: list[str] = []
    bases = []
    for base in (variant.base_build, variant.base_runtime):
        try:
            bases.append(image_size(base, inspect))
        except (OSError, subprocess.CalledProcessError, StopIteration, KeyError):
            bases.append(0.0)
            unknown.append(f"base image {base}")
    wheels, venv, missing = wheel_bytes(locks.read_lock(locks.lock_path(variant)), files)
    unknown += [f"wheel {name}" for name in missing]
    return Budget(bases[0], bases[1], wheels, venv, tuple(unknown), cache_write)


def peak_use(samples: list[int]) -> int:
    """Bytes a build added at its peak: the most used minus the first sample, taken before it
    started (`df -B1 --output=used` lines, one per sample)."""
    return max(samples) - samples[0] if samples else 0


def read_samples(log: Path) -> list[int]:
    return [int(line) for line in log.read_text().split() if line.isdigit()]


def main(
    variant: Variant, paths: list[Path], *, cache_write: bool = False, peak_log: Path | None = None
) -> int:
    """Print the budget and the free space; 1 when the first existing path has too little.
    With `peak_log`, print the build's measured peak instead, and 1 when it exceeded the
    budget (the model undercounts: fix it)."""
    plan = budget(variant, cache_write=cache_write)
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
