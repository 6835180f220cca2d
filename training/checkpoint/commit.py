"""Committing: make a step folder's files durable, list them, and write its manifest last.

A folder becomes a checkpoint only when its manifest (``training.checkpoint.layout``)
is in place, written atomically after every listed file was fsynced; the pointer to
the newest step follows it. A crash at any point before leaves a folder without a
manifest, which resume never takes.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from training.checkpoint.errors import CheckpointError
from training.checkpoint.layout import (
    COMMIT_MARKER,
    POINTER_NAME,
    describe_file,
    fsync_path,
    manifest_bytes,
    write_atomically,
)

log = logging.getLogger(__name__)


def make_durable(folder: Path, known: dict[str, dict]) -> dict[str, dict]:
    """fsync every file under ``folder`` and the folders; returns each file's manifest entry.

    ``known`` holds the entries the writing ranks computed; a file no rank reported
    (written by DeepSpeed outside its checkpoint engine) is checksummed here.
    """
    files = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and p.name != COMMIT_MARKER):
        fsync_path(path)
        name = path.relative_to(folder).as_posix()
        entry = known.get(name)
        if entry is None or entry["size"] != path.stat().st_size:
            entry = describe_file(path)
        files[name] = entry
    for sub in {p.parent for p in folder.rglob("*")} | {folder}:
        fsync_path(sub, directory=True)
    return files


def merge_listings(listings: list[dict[str, dict]]) -> dict[str, dict]:
    """One manifest listing from each writer's; a file two nodes list differently fails."""
    merged: dict[str, dict] = {}
    for listing in listings:
        for name, entry in listing.items():
            if merged.setdefault(name, entry) != entry:
                raise CheckpointError(f"{name} differs between nodes ({merged[name]} vs {entry})")
    return dict(sorted(merged.items()))


def commit(root: Path, record: dict) -> None:
    """Write the manifest of ``record["tag"]``, then point ``root``'s pointer at it."""
    step_dir = root / record["tag"]
    write_atomically(step_dir / COMMIT_MARKER, manifest_bytes(record))
    write_atomically(root / POINTER_NAME, (record["tag"] + "\n").encode())
    log.info("committed checkpoint %s (%d files)", step_dir, len(record["files"]))


def remove_step_dir(step_dir: Path) -> None:
    # Marker first: a folder whose removal is interrupted is never taken as committed.
    (step_dir / COMMIT_MARKER).unlink(missing_ok=True)
    shutil.rmtree(step_dir, ignore_errors=True)
