"""Lock files: the exact packages (with hashes) each variant's image installs.

A lock is a pip requirements file, images/locks/<variant>.txt. `python -m images lock
<variant>` makes it: pip resolves requirements-train.txt (torch from the variant's own
index, DeepSpeed at the matrix's version) without installing anything, and every pin
gets the sha256 of each file its index publishes for that version.

DeepSpeed comes last, after a marker line: the image builds it from source against the
torch the lines above installed (see images/Dockerfile).

When the variant's torch index cannot be reached (as on machines that reach PyPI only),
the lock is resolved against a stand-in torch of the same version: a local CPU wheel
(--find-links), else a dependency-free placeholder. Every other line is exact and hashed,
but torch has no hash and its CUDA dependencies (nvidia-*, triton; with the placeholder
all its dependencies) are missing. Such a lock says so in its header, and the build
refuses it until it is regenerated where the index is reachable.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path

from images.build_args import REPO_ROOT
from images.matrix import Variant

LOCKS_DIR = REPO_ROOT / "images" / "locks"
TRAIN_REQUIREMENTS = REPO_ROOT / "requirements-train.txt"
PYPI_INDEX = "https://pypi.org/simple"
# Installed from the lock too: the DeepSpeed build runs without build isolation.
BUILD_TOOLS = ("setuptools", "wheel")
DEEPSPEED_MARKER = "# -- deepspeed: built from source after the lines above, against their torch"
INCOMPLETE_MARKER = "# INCOMPLETE:"

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


def torch_local_version(variant: Variant) -> str:
    """The pytorch indexes name builds <version>+<index suffix>, e.g. 2.13.0+cu126."""
    return f"{variant.torch}+{variant.torch_index.rstrip('/').rsplit('/', 1)[-1]}"


def torch_requirement(variant: Variant) -> str:
    return f"torch=={torch_local_version(variant)}"


def requirements(path: Path = TRAIN_REQUIREMENTS) -> dict[str, str]:
    """The requirement lines of a requirements file, by normalized name."""
    lines = {}
    for raw in path.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if line:
            lines[normalize(re.split(r"[=<>!~;\[ ]", line, maxsplit=1)[0])] = line
    return lines


def lock_inputs(variant: Variant, path: Path = TRAIN_REQUIREMENTS) -> list[str]:
    """requirements-train.txt with torch and DeepSpeed pinned as the matrix says."""
    pinned = {"torch": torch_requirement(variant), "deepspeed": f"deepspeed=={variant.deepspeed}"}
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


def resolve(inputs: list[str], indexes: list[str], *find_links: Path | None) -> list[dict]:
    """pip's resolution of `inputs` for this interpreter: the report's `install` list."""
    env = pip_env()
    with tempfile.TemporaryDirectory(prefix="lock-") as tmp:
        requirements = Path(tmp) / "requirements.in"
        requirements.write_text("\n".join(inputs) + "\n")
        report = Path(tmp) / "report.json"
        command = [
            sys.executable,
            "-m",
            "pip",
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


def make_lock(variant: Variant, find_links: Path | None = None) -> str:
    """Resolve and hash the variant's packages; return the lock file's text."""
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    if python != variant.python:
        raise LockError(
            f"variant {variant.name!r} runs Python {variant.python} but this is Python "
            f"{python}: run `python{variant.python} -m images lock {variant.name}`"
        )
    inputs = lock_inputs(variant)
    if index_reachable(variant.torch_index):
        items = resolve(inputs, [PYPI_INDEX, variant.torch_index], find_links)
        return render_lock(variant, items, [])
    # pip would retry the dead index for every package: leave it out, and let pip see a
    # torch of the same version instead: a local CPU wheel, else a placeholder.
    cpu_wheel = local_cpu_torch(variant, find_links)
    if cpu_wheel and torch_local_version(variant).endswith("+cpu"):
        items = resolve(inputs, [PYPI_INDEX], find_links)
        return render_lock(variant, items, [])
    with tempfile.TemporaryDirectory(prefix="torch-stand-in-") as tmp:
        if cpu_wheel:
            stand_in, links = f"torch=={variant.torch}+cpu", find_links
            missing = "torch's CUDA dependencies (nvidia-*, triton) are not listed"
        else:
            stand_in, links = torch_requirement(variant), placeholder_torch(variant, Path(tmp))
            missing = "torch's dependencies (nvidia-*, triton, sympy, ...) are not listed"
        inputs = [stand_in if line == torch_requirement(variant) else line for line in inputs]
        items = resolve(inputs, [PYPI_INDEX], links, find_links)
    incomplete = [
        f"{variant.torch_index} was unreachable when this lock was made, so "
        f"{torch_requirement(variant)} has no hash and {missing}.",
        f"Regenerate where that index is reachable: python -m images lock {variant.name}",
    ]
    return render_lock(variant, items, incomplete)


def local_cpu_torch(variant: Variant, find_links: Path | None) -> Path | None:
    """A CPU torch wheel of the variant's version and Python in find_links, if any."""
    if find_links is None:
        return None
    tag = "cp" + variant.python.replace(".", "")
    return next(iter(sorted(find_links.glob(f"torch-{variant.torch}+cpu-{tag}-*.whl"))), None)


def placeholder_torch(variant: Variant, folder: Path) -> Path:
    """A dependency-free wheel named like the variant's torch: lets pip resolve the rest.

    It only ever feeds the resolver; the lock marks torch as unhashed and incomplete.
    """
    version = torch_local_version(variant)
    dist_info = f"torch-{version}.dist-info"
    files = {
        f"{dist_info}/METADATA": f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n",
        f"{dist_info}/WHEEL": "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    files[f"{dist_info}/RECORD"] = "".join(
        f"{name},,\n" for name in [*files, f"{dist_info}/RECORD"]
    )
    wheel = folder / f"torch-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
    return folder


def render_lock(variant: Variant, items: list[dict], incomplete: list[str]) -> str:
    """The lock file's text from pip's report items; `incomplete` lists why it is not whole."""
    entries: dict[str, str] = {}
    for item in items:
        name = normalize(item["metadata"]["name"])
        if incomplete and name == "torch":  # a stand-in was resolved: name the real one
            version, hashes = torch_local_version(variant), ()
        else:
            version, hashes = item["metadata"]["version"], hashes_for(item)
        lines = [f"{name}=={version}", *(f"--hash=sha256:{h}" for h in hashes)]
        entries[name] = " \\\n    ".join(lines)
    deepspeed = entries.pop("deepspeed")
    header = [
        f"# Lock for the {variant.name} image: torch {variant.torch} from {variant.torch_index},",
        f"# DeepSpeed {variant.deepspeed}, Python {variant.python}. Made by",
        f"#   python -m images lock {variant.name}",
        "# from requirements-train.txt and images/matrix.toml; do not edit by hand.",
        *(f"{INCOMPLETE_MARKER} {reason}" for reason in incomplete),
        "# The image build passes the indexes (PyPI, and the torch index for torch).",
        "",
    ]
    body = [entries[name] for name in sorted(entries)]
    return "\n".join([*header, *body, "", DEEPSPEED_MARKER, deepspeed, ""])


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
    indexes = [PYPI_INDEX, variant.torch_index]
    if not index_reachable(variant.torch_index):
        indexes = [PYPI_INDEX]  # torch must then be in find_links
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
