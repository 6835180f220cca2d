"""Damaged checkpoints: named in one line and set aside, never loaded and never deleted.

A folder whose files no longer match its manifest (or whose manifest does not parse) is
moved under ``<root>/damaged/`` (``layout.DAMAGED_DIR``), with the time it was found: out of
every listing, so resume takes an older checkpoint and the next save of that step writes
it anew, while what the disk did to it stays there to inspect (delete it by hand).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from training.checkpoint.layout import DAMAGED_DIR

log = logging.getLogger(__name__)


def set_aside(folder: Path, root: Path, reason: str, then: str) -> Path:
    """Move ``folder`` (a step folder of ``root``, or its universal conversion) to
    ``root/damaged/``; one warning says what is wrong with it, where it went and ``then``,
    what happens instead. Returns the new place."""
    name = folder.relative_to(root).as_posix().replace("/", "-")
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    aside = root / DAMAGED_DIR / f"{name}.{stamp}"
    number = 1
    while aside.exists():
        aside = aside.with_name(f"{name}.{stamp}-{number}")
        number += 1
    aside.parent.mkdir(parents=True, exist_ok=True)
    folder.rename(aside)
    log.warning("%s is damaged: %s; set aside as %s (not deleted); %s", folder, reason, aside, then)
    return aside


def set_aside_folders(root: Path) -> list[str]:
    """The folders set aside under ``root`` so far, oldest name first."""
    damaged = root / DAMAGED_DIR
    return sorted(p.name for p in damaged.iterdir()) if damaged.is_dir() else []
