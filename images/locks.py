"""Lock files: the exact packages (with hashes) each variant's image installs.

A lock is a pip requirements file, images/locks/<variant>.txt, made by
`python -m images lock <variant>`, which runs `uv pip compile --generate-hashes` on
requirements-train.txt for the variant's Python and base OS (glibc), torch and DeepSpeed
overridden to the matrix's pins. Project code does only what uv cannot express:

- the override file, written from the matrix (torch's build, DeepSpeed's release);
- the install order: DeepSpeed's entry moves below a marker line, because the image
  installs everything above it first and then builds DeepSpeed from source against that
  torch (--no-build-isolation, images/Dockerfile); a requirements file has no order;
- the check before a build that the committed lock is whole and is the matrix's
  (`check_lock`): every pin hashed, torch and DeepSpeed at the matrix's versions.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from images.build_args import REPO_ROOT
from images.matrix import Matrix, TorchWheels, Variant

LOCKS_DIR = REPO_ROOT / "images" / "locks"
TRAIN_REQUIREMENTS = REPO_ROOT / "requirements-train.txt"
PYPI_INDEX = "https://pypi.org/simple"
DEEPSPEED_MARKER = "# -- deepspeed: built from source after the lines above, against their torch"

_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)")
_HASH = re.compile(r"--hash=sha256:([0-9a-f]{64})")


class LockError(RuntimeError):
    """A lock cannot be made or used (unreachable index, failed resolution, bad file)."""


@dataclass(frozen=True)
class Pin:
    name: str
    version: str
    hashes: tuple[str, ...]


@dataclass(frozen=True)
class Lock:
    pins: dict[str, Pin]  # by normalized name
    deepspeed_last: bool  # DeepSpeed is the only entry below the marker line

    @property
    def needs_torch_index(self) -> bool:
        """Torch pinned as <release>+<variant> comes from the variant's index, not PyPI."""
        return "+" in self.pins["torch"].version

    @property
    def unhashed(self) -> tuple[str, ...]:
        return tuple(f"{p.name}=={p.version}" for p in self.pins.values() if not p.hashes)


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def lock_path(variant: Variant) -> Path:
    return LOCKS_DIR / f"{variant.name}.txt"


def _entries(text: str) -> list[tuple[str, list[str]]]:
    """Split a requirements file into (pin line, its continuation and comment lines)."""
    entries: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if _PIN.match(line):
            entries.append((line, []))
        elif entries and line.startswith(" "):
            entries[-1][1].append(line)
    return entries


def read_lock(path: Path) -> Lock:
    """Parse a lock file (uv's format: a pin, then its indented --hash and # via lines)."""
    if not path.exists():
        raise LockError(f"{path}: no lock file; make it with `python -m images lock {path.stem}`")
    text = path.read_text()
    _, marker, tail = text.partition(DEEPSPEED_MARKER)
    pins = {}
    for pin, rest in _entries(text):
        name, version = _PIN.match(pin).groups()
        options = [line for line in [pin, *rest] if not line.lstrip().startswith("#")]
        hashes = tuple(h for line in options for h in _HASH.findall(line))
        pins[normalize(name)] = Pin(name, version, hashes)
    below = [normalize(_PIN.match(pin)[1]) for pin, _ in _entries(tail)]
    return Lock(pins, deepspeed_last=bool(marker) and below == ["deepspeed"])


def torch_version(variant: Variant, wheels: TorchWheels) -> str:
    """The torch version the lock pins: PyPI's plain release when it is the variant's
    build, else the variant index's <release>+<variant> (e.g. 2.13.0+cpu)."""
    if wheels.pypi_default:
        return variant.torch
    return f"{variant.torch}+{variant.wheel_variant}"


def index_reachable(url: str, timeout: float = 15.0) -> bool:
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/torch/", timeout=timeout):
            return True
    except (urllib.error.URLError, OSError):
        return False


def local_torch(variant: Variant, find_links: Path | None) -> Path | None:
    """A torch wheel of the variant's build and Python in find_links, if any."""
    if find_links is None:
        return None
    tag = "cp" + variant.python.replace(".", "")
    pattern = f"torch-{variant.torch}+{variant.wheel_variant}-{tag}-*.whl"
    return next(iter(sorted(find_links.glob(pattern))), None)


def torch_sources(variant: Variant, wheels: TorchWheels, find_links: Path | None) -> list[str]:
    """uv's index and find-links arguments: PyPI, plus where torch's build lives."""
    sources = ["--index-url", PYPI_INDEX]
    if wheels.pypi_default:
        return sources  # PyPI's torch is the build; its nvidia-* wheels are on PyPI too
    if local_torch(variant, find_links):
        return [*sources, "--find-links", str(find_links)]
    if index_reachable(variant.torch_index):
        # Torch only from its index: a same-named package on PyPI must not win.
        return [*sources, "--extra-index-url", variant.torch_index]
    where = f" or in {find_links}" if find_links else ""
    raise LockError(
        f"torch=={torch_version(variant, wheels)} is not reachable: {variant.torch_index} does "
        f"not answer and no torch-{variant.torch}+{variant.wheel_variant} wheel for Python "
        f"{variant.python} lies in --find-links{where}; lock where one of them is reachable"
    )


def uv_binary() -> str:
    """The uv executable of the uv package installed with this Python (requirements-dev.txt)."""
    try:
        from uv import find_uv_bin
    except ImportError:
        raise LockError("locking needs uv: pip install -r requirements-dev.txt") from None
    return find_uv_bin()


def make_lock(matrix: Matrix, variant: Variant, find_links: Path | None = None) -> str:
    """Resolve and hash the variant's packages with uv; return the lock file's text."""
    wheels = matrix.wheels(variant)
    glibc = matrix.os_of(variant).glibc
    overrides = [f"torch=={torch_version(variant, wheels)}", f"deepspeed=={variant.deepspeed}"]
    with tempfile.TemporaryDirectory(prefix="lock-") as tmp:
        override_file = Path(tmp) / "overrides.txt"
        override_file.write_text("\n".join(overrides) + "\n")
        command = [
            uv_binary(), "pip", "compile", TRAIN_REQUIREMENTS.name,
            "--override", str(override_file),
            "--generate-hashes", "--no-config", "--quiet",
            "--python-version", variant.python,
            "--python-platform", f"x86_64-manylinux_{glibc.replace('.', '_')}",
            *torch_sources(variant, wheels, find_links),
            "--custom-compile-command", f"python -m images lock {variant.name}",
        ]  # fmt: skip
        result = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        tail = result.stderr.strip().splitlines()[-3:] or ["(no output)"]
        raise LockError(f"uv could not resolve the {variant.name} lock: {' '.join(tail)}")
    header = [
        f"# The {variant.name} image: torch {torch_version(variant, wheels)}, DeepSpeed "
        f"{variant.deepspeed}, Python {variant.python}.",
        f"# Wheels for manylinux_{glibc.replace('.', '_')} (the base OS's glibc); from "
        "images/matrix.toml and requirements-train.txt. Do not edit by hand.",
    ]
    body = result.stdout.replace(str(override_file), "overrides from the matrix")
    return "\n".join(header) + "\n" + _deepspeed_last(body)


def _deepspeed_last(text: str) -> str:
    """Move DeepSpeed's entry below the marker line (see the module docstring)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("deepspeed=="))
    end = next(
        (i for i in range(start + 1, len(lines)) if not lines[i].startswith(" ")), len(lines)
    )
    entry = lines[start:end]
    rest = lines[:start] + lines[end:]
    return "\n".join([*rest, "", DEEPSPEED_MARKER, *entry, ""])


def check_lock(matrix: Matrix, variant: Variant) -> Lock:
    """The committed lock, or LockError saying why the image cannot be built from it."""
    path = lock_path(variant)
    lock = read_lock(path)
    wheels = matrix.wheels(variant)
    problems = []
    if lock.unhashed:
        problems.append(f"pins without a hash: {', '.join(lock.unhashed)}")
    for name, want in (("torch", torch_version(variant, wheels)), ("deepspeed", variant.deepspeed)):
        have = lock.pins.get(name)
        if have is None or have.version != want:
            found = have.version if have else "missing"
            problems.append(f"{name} is {found}, the matrix says {want}")
    if not lock.deepspeed_last:
        problems.append(f"DeepSpeed is not the only entry below {DEEPSPEED_MARKER!r}")
    if problems:
        raise LockError(
            f"{path.relative_to(REPO_ROOT)} cannot build the {variant.name} image: "
            f"{'; '.join(problems)}; regenerate it with `python -m images lock {variant.name}`"
        )
    return lock


def fill_wheelhouse(
    matrix: Matrix, variant: Variant, dest: Path, find_links: Path | None = None
) -> None:
    """Download every file the variant's lock names into dest, hash-checked.

    For an offline build: `python -m images build <variant> --wheelhouse dest --offline`.
    """
    lock = check_lock(matrix, variant)
    sources = ["--index-url", PYPI_INDEX]
    if lock.needs_torch_index and index_reachable(variant.torch_index):
        sources += ["--extra-index-url", variant.torch_index]  # else torch from find_links
    dest.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--require-hashes", "--isolated",
        "--dest", str(dest), *sources,
        *(["--find-links", str(find_links)] if find_links else []),
        "-r", str(lock_path(variant)),
    ]  # fmt: skip
    if subprocess.run(command, check=False).returncode != 0:
        raise LockError(f"pip could not download the {variant.name} lock into {dest} (see above)")
