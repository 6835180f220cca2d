"""Lock files: the exact packages (with hashes) each variant's image installs.

A lock is a pip requirements file, images/locks/<variant>.txt. `python -m images lock
<variant>` makes it: pip resolves requirements-train.txt (DeepSpeed at the matrix's
version) for the variant's Python without installing or downloading anything (PEP 658
metadata), and every pin gets the sha256 of each file its index publishes for that version.

Torch comes from PyPI when PyPI's plain torch==<release> is the variant's build (the
matrix's torch_wheels say `pypi_default`: cu130 for torch 2.13), else from the variant's
own index (torch==<release>+<variant>). DeepSpeed comes last, after a marker line: the
image builds it from source against the torch the lines above installed (images/Dockerfile).

When a torch index cannot be reached (as on machines that reach PyPI only), PyPI's torch of
the same release stands in for the resolution: every other line is exact and hashed, but
torch has no hash and its CUDA dependencies are missing. Such a lock says so in its header,
and the build refuses it until it is regenerated where the index is reachable.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from images.build_args import REPO_ROOT
from images.matrix import TorchWheels, Variant

LOCKS_DIR = REPO_ROOT / "images" / "locks"
TRAIN_REQUIREMENTS = REPO_ROOT / "requirements-train.txt"
PYPI_INDEX = "https://pypi.org/simple"
# Installed from the lock too: the DeepSpeed build runs without build isolation.
BUILD_TOOLS = ("setuptools", "wheel")
DEEPSPEED_MARKER = "# -- deepspeed: built from source after the lines above, against their torch"
INCOMPLETE_MARKER = "# INCOMPLETE:"

# What a CUDA torch build pulls in beyond its pure-Python dependencies.
CUDA_DEPENDENCY = re.compile(r"^(nvidia-|cuda-|triton$)")

_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)")
_HASH = re.compile(r"--hash=sha256:([0-9a-f]{64})")


class LockError(RuntimeError):
    """A lock cannot be made or read (unreachable index, missing wheel, bad file)."""


@dataclass(frozen=True)
class Pin:
    name: str
    version: str
    hashes: tuple[str, ...]


@dataclass(frozen=True)
class Lock:
    pins: dict[str, Pin]  # by normalized name
    incomplete: tuple[str, ...]  # the header's reasons, empty for a complete lock

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


def read_lock(path: Path) -> Lock:
    """Parse a lock file written by write_lock (continuation lines carry the hashes)."""
    if not path.exists():
        raise LockError(f"{path}: no lock file; make it with `python -m images lock {path.stem}`")
    pins: dict[str, Pin] = {}
    incomplete: list[str] = []
    current: Pin | None = None
    for line in path.read_text().splitlines():
        if line.startswith(INCOMPLETE_MARKER):
            incomplete.append(line.removeprefix(INCOMPLETE_MARKER).strip())
        pin = _PIN.match(line)
        if pin:
            current = Pin(pin[1], pin[2], ())
        if current is not None:
            current = Pin(
                current.name, current.version, current.hashes + tuple(_HASH.findall(line))
            )
            pins[normalize(current.name)] = current
        if not line.rstrip().endswith("\\"):
            current = None
    return Lock(pins, tuple(incomplete))


def torch_version(variant: Variant, wheels: TorchWheels) -> str:
    """The torch version the lock pins: PyPI's plain release when it is the variant's
    build, else the variant index's <release>+<variant> (e.g. 2.13.0+cu126)."""
    if wheels.pypi_default:
        return variant.torch
    return f"{variant.torch}+{variant.wheel_variant}"


def torch_requirement(variant: Variant, wheels: TorchWheels) -> str:
    return f"torch=={torch_version(variant, wheels)}"


def requirements(path: Path = TRAIN_REQUIREMENTS) -> dict[str, str]:
    """The requirement lines of a requirements file, by normalized name."""
    lines = {}
    for raw in path.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if line:
            lines[normalize(re.split(r"[=<>!~;\[ ]", line, maxsplit=1)[0])] = line
    return lines


def lock_inputs(
    variant: Variant, wheels: TorchWheels, path: Path = TRAIN_REQUIREMENTS
) -> list[str]:
    """requirements-train.txt with torch and DeepSpeed pinned as the matrix says."""
    pinned = {
        "torch": torch_requirement(variant, wheels),
        "deepspeed": f"deepspeed=={variant.deepspeed}",
    }
    lines = [pinned.get(name, line) for name, line in requirements(path).items()]
    return [*lines, *BUILD_TOOLS]


def index_reachable(url: str, timeout: float = 15.0) -> bool:
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/torch/", timeout=timeout):
            return True
    except (urllib.error.URLError, OSError):
        return False


def pip_env() -> dict[str, str]:
    """This environment without pip's settings (its CA bundle aside): only the indexes
    and folders a command names count, whatever the machine's pip config says."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") or k == "PIP_CERT"}
    return {**env, "PIP_CONFIG_FILE": os.devnull}


def resolve(
    inputs: list[str], indexes: list[str], python: str, *find_links: Path | None
) -> list[dict]:
    """pip's resolution of `inputs` for the interpreter `python`: the report's `install` list."""
    env = pip_env()
    with tempfile.TemporaryDirectory(prefix="lock-") as tmp:
        requirements = Path(tmp) / "requirements.in"
        requirements.write_text("\n".join(inputs) + "\n")
        report = Path(tmp) / "report.json"
        command = [
            sys.executable,
            "-m",
            "pip",
            "--python",
            python,
            "install",
            "--dry-run",
            "--ignore-installed",
            "--quiet",
            "--report",
            str(report),
            "--index-url",
            indexes[0],
            *(arg for url in indexes[1:] for arg in ("--extra-index-url", url)),
            *(
                arg
                for links in dict.fromkeys(find_links)
                if links
                for arg in ("--find-links", str(links))
            ),
            "-r",
            str(requirements),
        ]
        result = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            tail = result.stderr.strip().splitlines()[-1:] or ["(no output)"]
            raise LockError(f"pip could not resolve the lock inputs: {tail[0]}")
        return json.loads(report.read_text())["install"]


def index_hashes(name: str, version: str, index: str = PYPI_INDEX) -> tuple[str, ...]:
    """sha256 of every file the index publishes for name==version (PEP 691 JSON)."""
    from packaging.utils import (
        InvalidSdistFilename,
        InvalidWheelFilename,
        parse_sdist_filename,
        parse_wheel_filename,
    )
    from packaging.version import Version

    request = urllib.request.Request(
        f"{index}/{normalize(name)}/", headers={"Accept": "application/vnd.pypi.simple.v1+json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        files = json.load(response)["files"]
    hashes = []
    for file in files:
        filename = file["filename"]
        try:
            parsed = (
                parse_wheel_filename(filename)[1]
                if filename.endswith(".whl")
                else parse_sdist_filename(filename)[1]
            )
        except (InvalidWheelFilename, InvalidSdistFilename):
            continue
        if parsed == Version(version) and "sha256" in file.get("hashes", {}):
            hashes.append(file["hashes"]["sha256"])
    return tuple(sorted(hashes))


def hashes_for(item: dict) -> tuple[str, ...]:
    """Every hash an install may meet for this report item."""
    info = item["download_info"]
    url = urllib.parse.urlparse(info["url"])
    found = set(info.get("archive_info", {}).get("hashes", {}).get("sha256", "").split()) - {""}
    if url.scheme == "file":
        found.add(hashlib.sha256(Path(urllib.parse.unquote(url.path)).read_bytes()).hexdigest())
    elif url.hostname == "files.pythonhosted.org":
        meta = item["metadata"]
        found.update(index_hashes(meta["name"], meta["version"]))
    return tuple(sorted(found))


def lock_python(variant: Variant, python: Path | None = None) -> str:
    """The interpreter pip resolves for (markers, wheel tags): one of the variant's version.

    `python -m images` itself may run on another version: pip's --python does the rest.
    """
    wanted = variant.python
    if python is not None:
        candidate = str(python)
    elif f"{sys.version_info.major}.{sys.version_info.minor}" == wanted:
        candidate = sys.executable
    else:
        candidate = shutil.which(f"python{wanted}")
    if candidate is None:
        raise LockError(
            f"variant {variant.name!r} runs Python {wanted} and there is no python{wanted} "
            f"on PATH: install it or pass --python /path/to/python{wanted}"
        )
    try:
        found = subprocess.run(
            [candidate, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        raise LockError(f"--python {candidate}: not a Python interpreter that runs") from None
    if found != wanted:
        raise LockError(
            f"variant {variant.name!r} runs Python {wanted} but {candidate} is Python {found}: "
            f"pass --python /path/to/python{wanted}"
        )
    return candidate


def make_lock(
    variant: Variant,
    wheels: TorchWheels,
    find_links: Path | None = None,
    python: Path | None = None,
) -> str:
    """Resolve and hash the variant's packages; return the lock file's text."""
    interpreter = lock_python(variant, python)
    inputs = lock_inputs(variant, wheels)
    if wheels.pypi_default:
        # PyPI's plain torch is this build and its nvidia-* wheels are on PyPI: no
        # other index is needed, wherever the lock is made.
        items = resolve(inputs, [PYPI_INDEX], interpreter)
        return render_lock(variant, wheels, items, [])
    if index_reachable(variant.torch_index):
        items = resolve(inputs, [PYPI_INDEX, variant.torch_index], interpreter, find_links)
        return render_lock(variant, wheels, items, [])
    if variant.cuda is None and local_cpu_torch(variant, find_links):
        items = resolve(inputs, [PYPI_INDEX], interpreter, find_links)
        return render_lock(variant, wheels, items, [])
    # pip would retry the dead index for every package: leave it out, and let PyPI's
    # torch of the same release stand in for the resolution of everything else.
    stand_in = f"torch=={variant.torch}"
    inputs = [stand_in if line == torch_requirement(variant, wheels) else line for line in inputs]
    items = [
        item
        for item in resolve(inputs, [PYPI_INDEX], interpreter)
        if item.get("requested") or not CUDA_DEPENDENCY.match(normalize(item["metadata"]["name"]))
    ]
    incomplete = [
        f"{variant.torch_index} was unreachable when this lock was made: "
        f"{torch_requirement(variant, wheels)} is listed without a hash, and its CUDA "
        "dependencies (its nvidia-* wheels, cuda-*, triton) are missing.",
        f"Its other dependencies were resolved with PyPI's {stand_in} (another CUDA build "
        "of the same release) standing in.",
        f"Complete it where that index is reachable, on Python {variant.python}: "
        f"python -m images lock {variant.name}",
    ]
    return render_lock(variant, wheels, items, incomplete)


def local_cpu_torch(variant: Variant, find_links: Path | None) -> Path | None:
    """A CPU torch wheel of the variant's version and Python in find_links, if any."""
    if find_links is None:
        return None
    tag = "cp" + variant.python.replace(".", "")
    return next(iter(sorted(find_links.glob(f"torch-{variant.torch}+cpu-{tag}-*.whl"))), None)


def render_lock(
    variant: Variant, wheels: TorchWheels, items: list[dict], incomplete: list[str]
) -> str:
    """The lock file's text from pip's report items; `incomplete` lists why it is not whole.

    Each pin is preceded by the file pip chose for the variant's Python (torch's also by its
    requirements), so that what the image will install can be read and checked offline.
    """
    entries: dict[str, str] = {}
    for item in items:
        name = normalize(item["metadata"]["name"])
        filename = urllib.parse.unquote(item["download_info"]["url"].rsplit("/", 1)[-1])
        if incomplete and name == "torch":  # a stand-in was resolved: name the real one
            lines = [torch_requirement(variant, wheels)]
        else:
            hashes = hashes_for(item)
            version = item["metadata"]["version"]
            # torch's own requirements are kept for the tests that check the lock covers them.
            requires = item["metadata"].get("requires_dist", []) if name == "torch" else []
            comments = [f"# {filename}", *(f"#   requires {r}" for r in requires)]
            pin = "\n".join([*comments, f"{name}=={version}"])
            lines = [pin, *(f"--hash=sha256:{h}" for h in hashes)]
        entries[name] = " \\\n    ".join(lines)
    deepspeed = entries.pop("deepspeed")
    header = [
        f"# Lock for the {variant.name} image: torch {variant.torch} ({variant.wheel_variant} "
        f"build), DeepSpeed {variant.deepspeed},",
        f"# Python {variant.python}. Made by `python -m images lock {variant.name}` from",
        "# requirements-train.txt and images/matrix.toml; do not edit by hand.",
        *(f"{INCOMPLETE_MARKER} {reason}" for reason in incomplete),
        *torch_source(variant, wheels),
        "",
    ]
    body = [entries[name] for name in sorted(entries)]
    return "\n".join([*header, *body, "", DEEPSPEED_MARKER, deepspeed, ""])


def torch_source(variant: Variant, wheels: TorchWheels) -> list[str]:
    """Header lines that say where torch (and its hashes) came from, and which index the
    image build needs."""
    if wheels.pypi_default:
        build, release = variant.wheel_variant, variant.torch
        return [
            f"# torch: PyPI's torch=={release} files (hashes from PyPI's JSON API): PyPI's",
            f"# default torch {release} is PyTorch's {build} build (torch_wheels in",
            f"# images/matrix.toml), and the CUDA {variant.cuda} wheels it requires are pinned",
            f"# below. These are not the files {variant.torch_index} serves:",
            f"# those carry the version {release}+{build}, so their bytes and hashes differ;",
            "# that both are the same build is assumed, not checked. The image build uses",
            "# PyPI only.",
        ]
    return [
        f"# torch: from {variant.torch_index}, hashes from that index (or from a local",
        "# wheel's bytes when made with --find-links).",
        "# The image build passes the indexes (PyPI, and the torch index for torch).",
    ]


def fill_wheelhouse(variant: Variant, dest: Path, find_links: Path | None = None) -> None:
    """Download every file the variant's lock names into dest, hash-checked.

    For an offline build: `python -m images build <variant> --wheelhouse dest --offline`.
    """
    path = lock_path(variant)
    lock = read_lock(path)
    if lock.incomplete or lock.unhashed:
        raise LockError(
            f"{path} is incomplete; regenerate it first: python -m images lock {variant.name}"
        )
    # An unreachable torch index is left out (pip would retry it for every file).
    indexes = [PYPI_INDEX]
    if lock.needs_torch_index and index_reachable(variant.torch_index):
        indexes.append(variant.torch_index)  # else torch must be in find_links
    dest.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--require-hashes",
        "--dest", str(dest), "--index-url", indexes[0],
        *(arg for url in indexes[1:] for arg in ("--extra-index-url", url)),
        *(["--find-links", str(find_links)] if find_links else []),
        "-r", str(path),
    ]  # fmt: skip
    result = subprocess.run(command, env=pip_env(), check=False)
    if result.returncode != 0:
        raise LockError(f"pip could not download the {variant.name} lock into {dest} (see above)")
