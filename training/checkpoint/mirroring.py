"""Mirroring: copy a committed step folder to the remote store, committing it there last."""

from __future__ import annotations

import logging
from pathlib import Path

from training.checkpoint.collectives import Ranks
from training.checkpoint.store import CheckpointStore

log = logging.getLogger(__name__)


def mirror_step(ranks: Ranks, mirror: CheckpointStore, step_dir: Path, tag: str) -> None:
    """Every writer uploads its files; rank 0 commits in the store only if all succeeded.

    A failed upload is logged and does not end the run: the local commit stands, and
    the next save uploads again.
    """

    def upload_part() -> bool:
        try:
            mirror.upload_files(step_dir, tag)
        except Exception:
            log.exception("could not mirror %s to %s", step_dir, mirror.uri)
            return False
        return True

    def commit_remotely() -> None:
        try:
            mirror.commit(step_dir, tag)
        except Exception:
            log.exception("could not mirror %s to %s", step_dir, mirror.uri)

    if all(ranks.on_writers(upload_part)):
        ranks.on_rank0(commit_remotely)
