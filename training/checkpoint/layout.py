"""The on-disk vocabulary of checkpoints: names, tags, the commit manifest, atomic writes.

A leaf: it imports nothing of the project, and only the standard library at import
time (xxhash when a checksum is computed), so the image smoke test, export and
every storage backend share these names without pulling in torch or boto3.

Layout under a checkpoint root (local disk, or a prefix in object storage):

    step_00000100/              the files of the checkpoint of step 100
    step_00000100/commit.json   the manifest, written last: every file, its size and checksum
    latest_committed            names the newest committed step (for people and tools)
    universal/step_00000100/    step 100 converted for another data-parallel size
    damaged/step_00000100.<UTC time>   a folder found damaged, set aside (never deleted)

The manifest is what makes a folder a checkpoint. A folder is loadable only
when its manifest parses, its own checksum matches, and every file it lists is
present with the recorded size and (when verified) the recorded checksum.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

COMMIT_MARKER = "commit.json"
POINTER_NAME = "latest_committed"
UNIVERSAL_DIR = "universal"
# Folders whose files no longer match their manifest are moved here, out of every
# listing, rather than deleted: what the disk did to them is still there to inspect.
DAMAGED_DIR = "damaged"
# DeepSpeed copies these beside every ZeRO save; they import huggingface_hub, which the
# trainer does not install, so they cannot run: `python -m training export` converts.
DEEPSPEED_RECOVERY_SCRIPTS = ("zero_to_fp32.py", "zero_to_torch.py")
# The trainer's client_state sits under this key of DeepSpeed's, apart from its own entries.
CLIENT_STATE_KEY = "training_client_state"
# ds_to_universal refuses checkpoints that lack this client_state entry.
UNIVERSAL_INFO_KEY = "universal_checkpoint_info"
UNIVERSAL_INFO = {UNIVERSAL_INFO_KEY: {"universal_checkpoint_version": 0.2}}
# A ZeRO stage 0 checkpoint's manifest names its parameters in its optimizer's order, group
# by group: DeepSpeed's files number them only, and converting to another stage needs names.
PARAMETER_GROUPS_KEY = "parameter_groups"
_TAG_RE = re.compile(r"^step_(\d{8,})$")

# xxHash's XXH3 (64 bit): non-cryptographic, it detects accidental damage (a flipped
# byte, a torn write) at memory speed. https://xxhash.com/
CHECKSUM = "xxh3_64"
# The manifest's checksum covers the manifest's other keys, serialised canonically.
_MANIFEST_CHECKSUM_KEY = "manifest_xxh3_64"
_READ_CHUNK = 8 << 20

# What a step folder holds, as seen by the node looking at it.
COMPLETE = "complete"  # manifest and every listed file: loadable
PARTIAL = "partial"  # manifest, some files absent (another node's part): needs the mirror
DAMAGED = "damaged"  # manifest, but a file differs from it, or the manifest is unreadable
UNCOMMITTED = "uncommitted"  # no manifest: the save never finished


def tag_for(step: int) -> str:
    return f"step_{step:08d}"


def parse_step(tag: str) -> int | None:
    """The step of a ``step_NNNNNNNN`` tag, or None for any other name."""
    match = _TAG_RE.match(tag)
    return int(match.group(1)) if match else None


def step_dirs(root: Path) -> list[str]:
    """Tags of the step folders under ``root`` (committed or not), oldest first."""
    if not root.is_dir():
        return []
    tags = [p.name for p in root.iterdir() if p.is_dir() and parse_step(p.name) is not None]
    return sorted(tags, key=parse_step)


# ------------------------------------------------------------------ checksums


def file_checksum(path: Path) -> str:
    """The hex XXH3-64 of a file's bytes."""
    import xxhash

    digest = xxhash.xxh3_64()
    with open(path, "rb", buffering=0) as handle:
        while chunk := handle.read(_READ_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def describe_file(path: Path) -> dict[str, int | str]:
    """The manifest entry of one file: its size and checksum."""
    return {"size": path.stat().st_size, CHECKSUM: file_checksum(path)}


# ------------------------------------------------------------------- manifest


def manifest_bytes(record: dict) -> bytes:
    """The manifest file's content: ``record`` plus a checksum of itself."""
    body = {k: v for k, v in record.items() if k != _MANIFEST_CHECKSUM_KEY}
    sealed = {**body, _MANIFEST_CHECKSUM_KEY: _record_checksum(body)}
    return json.dumps(sealed, indent=1).encode()


def read_manifest(folder: Path) -> dict:
    """The manifest of a step folder.

    Raises FileNotFoundError when there is none, ValueError when it does not parse
    or its checksum does not match (a manifest from before checksums has none).
    """
    return parse_manifest((folder / COMMIT_MARKER).read_bytes())


def parse_manifest(data: bytes) -> dict:
    """A manifest from its bytes (a local file's or a remote copy's); ValueError as
    ``read_manifest``."""
    try:
        record = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{COMMIT_MARKER} is not JSON ({exc})") from None
    if not isinstance(record, dict) or not isinstance(record.get("files"), dict):
        raise ValueError(f"{COMMIT_MARKER} lists no files")
    recorded = record.pop(_MANIFEST_CHECKSUM_KEY, None)
    if recorded is not None and recorded != _record_checksum(record):
        raise ValueError(f"{COMMIT_MARKER} does not match its own checksum")
    return record


def manifest_checksum(record: dict) -> str:
    """The checksum a manifest of ``record`` carries: it names one checkpoint's content."""
    return _record_checksum({k: v for k, v in record.items() if k != _MANIFEST_CHECKSUM_KEY})


def _record_checksum(record: dict) -> str:
    import xxhash

    canonical = json.dumps(record, sort_keys=True, separators=(",", ":")).encode()
    return xxhash.xxh3_64_hexdigest(canonical)


def _entry(value) -> tuple[int, str | None]:
    """(size, checksum or None) of a manifest entry; older manifests hold the size only."""
    if isinstance(value, dict):
        return int(value["size"]), value.get(CHECKSUM)
    return int(value), None


def examine(folder: Path, *, verify: bool = False) -> tuple[str, str]:
    """(state, reason) of a step folder: COMPLETE, PARTIAL, DAMAGED or UNCOMMITTED.

    Sizes are always compared; with ``verify`` every present file is read and
    its checksum compared too (what resume and export do before loading).
    """
    try:
        record = read_manifest(folder)
        files = {name: _entry(value) for name, value in record["files"].items()}
    except FileNotFoundError:
        return UNCOMMITTED, f"no {COMMIT_MARKER} (the save did not finish)"
    except (ValueError, KeyError, TypeError) as exc:
        return DAMAGED, f"unreadable {COMMIT_MARKER}: {exc}"
    missing = []
    for name, (size, checksum) in files.items():
        path = folder / name
        if not path.is_file():
            missing.append(name)
            continue
        actual = path.stat().st_size
        if actual != size:
            return DAMAGED, f"{name} has {actual} bytes, {size} were saved"
        if verify and checksum is not None and file_checksum(path) != checksum:
            return DAMAGED, f"{name} does not match its checksum (its bytes changed after saving)"
    if missing:
        return PARTIAL, f"{len(missing)} of {len(files)} files are not here ({missing[0]}, ...)"
    return COMPLETE, "every file present" + (" and verified" if verify else "")


def committed_tags(root: Path) -> list[str]:
    """Tags of the loadable (complete, by size) step folders under ``root``, oldest first."""
    return [tag for tag in step_dirs(root) if examine(root / tag)[0] == COMPLETE]


# ------------------------------------------------------------------- writing


def write_atomically(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` so that a reader sees the old or the new file, whole."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_path(path.parent, directory=True)


def fsync_path(path: Path, *, directory: bool = False) -> None:
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
