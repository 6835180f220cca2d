"""Disk full during a save, on a real small filesystem (a tmpfs mounted by the test)."""

from __future__ import annotations

import logging
import shutil

import pytest
import torch

from tests.training.checkpoint_engine import build_engine, train_step, weights
from tests.training.conftest import fill_disk
from training.checkpoint.checkpointer import Checkpointer, DiskFullError
from training.checkpoint.layout import COMPLETE, examine, tag_for

LOGGER = "training.checkpoint"


def trained_engine(steps: int):
    engine = build_engine()
    for step in range(steps):
        train_step(engine, step)
    return engine


def test_disk_full_names_folder_and_sizes_and_keeps_earlier_checkpoints(
    single_rank, small_filesystem, caplog
):
    """Injects: the filesystem fills up between two saves. Proves: a warning before the
    save, one DiskFullError with the OS's words, the folder and both sizes; no
    half-written folder; the earlier checkpoint still loads, bit for bit."""
    root = small_filesystem / "checkpoints"
    checkpointer = Checkpointer(root)
    at_two = trained_engine(2)
    checkpointer.save(at_two, 2, {"step": 2})
    last_size = sum(p.stat().st_size for p in (root / tag_for(2)).iterdir())
    fill_disk(small_filesystem, leave=last_size // 4)

    with (
        caplog.at_level(logging.WARNING, logger=LOGGER),
        pytest.raises(DiskFullError) as raised,
    ):
        checkpointer.save(trained_engine(4), 4, {"step": 4})
    assert "less than the last checkpoint's" in caplog.text  # said before writing
    message = str(raised.value)
    assert message.startswith(f"No space left on device in {root}")
    assert f"{last_size:,} bytes" in message
    free = shutil.disk_usage(root).free
    assert f"{free:,} bytes are free" in message
    assert "TRAIN_CHECKPOINT_DIR" in message and "keep_last" in message

    assert not (root / tag_for(4)).exists()
    assert examine(root / tag_for(2), verify=True)[0] == COMPLETE
    resumed = build_engine(seed=1)
    assert Checkpointer(root).resume(resumed)["step"] == 2
    a, b = weights(resumed), weights(at_two)
    assert all(torch.equal(a[k], b[k]) for k in a)

    # Once space is freed, the same save succeeds.
    (small_filesystem / "filler").unlink()
    checkpointer.save(trained_engine(4), 4, {"step": 4})
    assert examine(root / tag_for(4), verify=True)[0] == COMPLETE
