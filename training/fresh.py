"""`--fresh`: start a run from step 0 by moving its old folders aside (never deleting them).

The trainer resumes from the newest committed checkpoint by itself; to start over
instead, the run folder (metrics, TensorBoard) and the checkpoint folder, when it
lies elsewhere, are renamed to `<name>.<UTC timestamp>` beside where they were.
"""

from __future__ import annotations

import datetime
from pathlib import Path

from training.environment import TrainerEnv
from training.spec.config import Config, ConfigError


def move_aside(
    config: Config, env: TrainerEnv, now: datetime.datetime | None = None
) -> list[tuple[Path, Path]]:
    """Rename the run's existing folders out of the way; returns (old, new) pairs."""
    if env.s3_uri:
        raise ConfigError(
            "--fresh moves local folders only, and TRAIN_S3_URI may hold this run's "
            "checkpoints, which the new run would resume from: point TRAIN_S3_URI at a new "
            "prefix instead of --fresh"
        )
    now = now or datetime.datetime.now(datetime.UTC)
    stamp = now.strftime("%Y%m%dT%H%M%SZ")
    folders = [config.output_dir]
    if not config.checkpoint_dir.resolve().is_relative_to(config.output_dir.resolve()):
        folders.append(config.checkpoint_dir)
    moved = []
    for folder in folders:
        if not folder.exists():
            continue
        target = folder.with_name(f"{folder.name}.{stamp}")
        number = 1
        while target.exists():
            target = folder.with_name(f"{folder.name}.{stamp}-{number}")
            number += 1
        folder.rename(target)
        moved.append((folder, target))
    return moved
