"""Asynchronous saves: training goes on while a copy of the state is written and committed."""

from __future__ import annotations

import logging
import threading

import pytest

from tests.training.checkpoint.test_checkpointer import assert_same_weights, trained_engine
from tests.training.checkpoint_engine import build_engine, train_step
from training.checkpoint import writer as writer_module
from training.checkpoint.checkpointer import Checkpointer, CheckpointError
from training.checkpoint.layout import COMMIT_MARKER, COMPLETE, examine, tag_for


def held_writer(engine) -> threading.Event:
    """The engine's configured checkpoint writer waits for the returned event to be set."""
    release = threading.Event()
    writer = engine.checkpoint_engine
    save = writer.save

    def held_save(state_dict, path):
        assert release.wait(60), "never released"
        save(state_dict, path)

    writer.save = held_save
    return release


def test_training_goes_on_while_the_save_is_written_and_the_checkpoint_holds_the_saved_step(
    single_rank, tmp_path
):
    """The write is held until the engine trained two more steps: the checkpoint still
    holds step 3's weights and optimizer state (resumed and trained on, it matches a run
    that never saved)."""
    engine = trained_engine(3)
    release = held_writer(engine)
    checkpointer = Checkpointer(tmp_path, asynchronous=True)
    step_dir = checkpointer.save(engine, 3, {"step": 3})
    assert checkpointer.in_flight
    assert not (step_dir / COMMIT_MARKER).exists()
    for step in (3, 4):
        train_step(engine, step)  # changes weights and Adam's moments in place
    release.set()
    checkpointer.wait()
    assert not checkpointer.in_flight
    assert examine(step_dir, verify=True)[0] == COMPLETE

    resumed = build_engine(seed=1)
    assert Checkpointer(tmp_path).resume(resumed)["step"] == 3
    for step in (3, 4):
        train_step(resumed, step)
    assert_same_weights(resumed, engine)


def test_a_second_save_waits_for_the_first_one_in_flight(single_rank, tmp_path):
    engine = trained_engine(1)
    release = held_writer(engine)
    checkpointer = Checkpointer(tmp_path, asynchronous=True)
    checkpointer.save(engine, 1, {"step": 1})
    train_step(engine, 1)
    second = threading.Thread(target=checkpointer.save, args=(engine, 2, {"step": 2}))
    second.start()
    second.join(1.0)
    assert second.is_alive()  # blocked behind step 1's write
    assert examine(tmp_path / tag_for(2))[0] != COMPLETE
    release.set()
    second.join(60)
    checkpointer.wait()
    assert [examine(tmp_path / tag_for(s))[0] for s in (1, 2)] == [COMPLETE, COMPLETE]


def test_save_with_wait_returns_committed(single_rank, tmp_path):
    checkpointer = Checkpointer(tmp_path, asynchronous=True)
    step_dir = checkpointer.save(trained_engine(2), 2, {"step": 2}, wait=True)
    assert not checkpointer.in_flight
    assert examine(step_dir, verify=True)[0] == COMPLETE


def test_too_little_host_memory_says_so_once_and_saves_while_training_waits(
    single_rank, tmp_path, monkeypatch, caplog
):
    monkeypatch.setattr(writer_module, "host_copy_budget", lambda ranks_per_node, staging: 100)
    checkpointer = Checkpointer(tmp_path, asynchronous=True)
    engine = trained_engine(1)
    with caplog.at_level(logging.WARNING, logger="training.checkpoint"):
        for step in (1, 2):
            train_step(engine, step)
            step_dir = checkpointer.save(engine, step, {"step": step})
            # Written before save returned: only the commit may still be in flight.
            written = list(step_dir.glob("*.pt"))
            assert len(written) == 2 and all(p.stat().st_size > 0 for p in written)
            checkpointer.wait()
            assert examine(step_dir, verify=True)[0] == COMPLETE
    assert caplog.text.count("host memory cannot hold a copy of the checkpoint") == 1


def test_a_failed_background_write_is_raised_by_the_next_save_and_leaves_no_folder(
    single_rank, tmp_path
):
    engine = trained_engine(1)
    writer = engine.checkpoint_engine

    def failing_save(state_dict, path):
        raise OSError(28, "No space left on device")

    checkpointer = Checkpointer(tmp_path, asynchronous=True)
    checkpointer.save(engine, 1, {"step": 1}, wait=True)
    writer.save = failing_save
    checkpointer.save(engine, 2, {"step": 2})
    with pytest.raises(CheckpointError, match="No space left on device"):
        checkpointer.wait()
    assert not (tmp_path / tag_for(2)).exists()
    assert examine(tmp_path / tag_for(1))[0] == COMPLETE


def test_a_file_saved_while_training_waits_keeps_its_shapes_as_torch_size():
    """The fallback's copy keeps what ZeRO-3's param_shapes need for an export (Size.numel)."""
    import collections

    import torch
    from deepspeed.runtime.checkpoint_engine.checkpoint_engine import CheckpointEngine

    written = {}

    class Recording(CheckpointEngine):
        def create(self, info):
            pass

        def save(self, state_dict, path):
            written[path] = state_dict

        def load(self, path, map_location=None):
            return written[path]

        def commit(self, info):
            return True

        def preserves_storage_sharing(self):
            return True  # as DeepSpeed's torch engine: the states are cloned before the write

    weights = torch.arange(6.0)
    state = {
        "param_shapes": [collections.OrderedDict(w=torch.Size([2, 3]))],
        "w": weights[:4],  # a view, saved without the rest of its storage
    }
    engine = writer_module.HostCopyWriter(
        Recording(), budget=0, staging=writer_module.StagingBuffers()
    )
    engine.save(state, "model_states.pt")
    saved = written["model_states.pt"]
    assert type(saved["param_shapes"][0]["w"]) is torch.Size
    assert saved["param_shapes"][0]["w"].numel() == 6
    assert saved["w"].untyped_storage().nbytes() == 4 * 4 and torch.equal(saved["w"], weights[:4])
