"""Pruning: keep the newest ``keep_last`` committed checkpoints, locally and in the mirror."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from training.checkpoint.commit import remove_step_dir
from training.checkpoint.damaged import set_aside
from training.checkpoint.layout import (
    COMPLETE,
    DAMAGED,
    PARTIAL,
    UNIVERSAL_DIR,
    examine,
    step_dirs,
)
from training.checkpoint.store import CheckpointStore, prune

log = logging.getLogger(__name__)


def prune_local(root: Path, keep_last: int) -> None:
    """Remove every step folder but the newest ``keep_last`` committed ones (uncommitted
    folders included), and the universal copies of the removed steps. A damaged folder
    is set aside instead (training.checkpoint.damaged)."""
    states = {tag: examine(root / tag) for tag in step_dirs(root)}
    kept = [tag for tag, (state, _) in states.items() if state in (COMPLETE, PARTIAL)]
    keep = set(kept[-keep_last:])
    for tag, (state, reason) in states.items():
        if state == DAMAGED:
            set_aside(root / tag, root, reason, then="resume never takes it")
        elif tag not in keep:
            log.info("pruning checkpoint %s (%s)", root / tag, state)
            remove_step_dir(root / tag)
    universal = root / UNIVERSAL_DIR
    if universal.is_dir():
        for converted in universal.iterdir():
            if converted.is_dir() and converted.name not in keep:
                shutil.rmtree(converted, ignore_errors=True)


def prune_mirror(mirror: CheckpointStore, keep_last: int) -> None:
    """The same in the mirror; a failure is logged and does not end the run."""
    try:
        for tag in prune(mirror, keep_last):
            log.info("pruned checkpoint %s/%s", mirror.uri, tag)
    except Exception:
        log.exception("could not prune old checkpoints in %s", mirror.uri)
