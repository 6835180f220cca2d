"""Asynchronous saves: training goes on while a copy of the state is written and committed."""

from __future__ import annotations

import copy
import logging
import threading

import pytest
import torch

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


def assert_same(saved, expected, where="state"):
    """Bit for bit: every tensor equal (dtype and shape included), every other value equal."""
    if isinstance(expected, torch.Tensor):
        assert saved.dtype == expected.dtype and torch.equal(saved, expected), where
    elif isinstance(expected, dict):
        assert saved.keys() == expected.keys(), where
        for key in expected:
            assert_same(saved[key], expected[key], f"{where}[{key!r}]")
    elif isinstance(expected, list):
        assert len(saved) == len(expected), where
        for index, (a, b) in enumerate(zip(saved, expected, strict=True)):
            assert_same(a, b, f"{where}[{index}]")
    elif hasattr(expected, "__dict__"):  # DeepSpeed's loss scaler, saved as an object
        assert type(saved) is type(expected), where
        assert_same(vars(saved), vars(expected), where)
    else:
        assert saved == expected, where


def engine_state(engine) -> dict:
    """Copies of what the ZeRO-2 save writes: the weights and the optimizer's state dict."""
    return cloned(
        {"module": engine.module.state_dict(), "optimizer": engine.optimizer.state_dict()}
    )


def cloned(value):
    """``value`` with every tensor cloned and every other object copied, kept apart from it."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, dict):
        return {key: cloned(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [cloned(item) for item in value]
    return copy.deepcopy(value)


def assert_files_hold(step_dir, expected):
    model = torch.load(step_dir / "mp_rank_00_model_states.pt", weights_only=False)
    optim = torch.load(step_dir / "zero_pp_rank_0_mp_rank_00_optim_states.pt", weights_only=False)
    assert_same(model["module"], expected["module"], f"{step_dir.name} module")
    assert_same(optim["optimizer_state_dict"], expected["optimizer"], f"{step_dir.name} optimizer")


class HandedOut:
    """The staging buffers each save copied into (StagingBuffers.copy's results), per save."""

    def __init__(self, monkeypatch):
        self.per_save: list[list[torch.Tensor]] = []
        copy = writer_module.StagingBuffers.copy

        def recording(staging, tensor):
            buffer = copy(staging, tensor)
            self.per_save[-1].append(buffer)
            return buffer

        monkeypatch.setattr(writer_module.StagingBuffers, "copy", recording)

    def next_save(self) -> None:
        self.per_save.append([])

    def pointers(self, save: int) -> list[int]:
        return sorted(buffer.data_ptr() for buffer in self.per_save[save])


def test_each_save_copies_into_the_last_ones_buffers_and_its_files_hold_its_own_step(
    single_rank, tmp_path, monkeypatch
):
    """Three saves with training in between: the second and third copy into the first's
    buffers (no new allocation), and each checkpoint holds, bit for bit, the state of its
    step, cloned apart when it was saved."""
    engine = trained_engine(1)
    handed_out = HandedOut(monkeypatch)
    checkpointer = Checkpointer(tmp_path, keep_last=3, asynchronous=True)
    expected = {}
    for step in (1, 2, 3):
        train_step(engine, step)
        expected[step] = engine_state(engine)
        handed_out.next_save()
        checkpointer.save(engine, step, {"step": step})
        checkpointer.wait()
    # Every tensor of both files went through a buffer: 4 weights and biases in the model
    # file; in the optimizer's, Adam's two moments and the fp32 partition of the one group.
    assert len(handed_out.per_save[0]) > 4 + 3
    assert handed_out.pointers(1) == handed_out.pointers(0)
    assert handed_out.pointers(2) == handed_out.pointers(0)
    assert {id(b) for b in handed_out.per_save[1]} == {id(b) for b in handed_out.per_save[0]}
    for step in (1, 2, 3):
        assert examine(tmp_path / tag_for(step), verify=True)[0] == COMPLETE
        assert_files_hold(tmp_path / tag_for(step), expected[step])
    checkpointer.close()
    assert checkpointer._staging.kept_bytes == 0


def test_a_save_started_while_the_last_one_is_written_waits_before_it_reuses_a_buffer(
    single_rank, tmp_path, monkeypatch
):
    """Step 1's write is held while step 2's save is asked for: step 2 copies nothing until
    step 1 is written, then copies into step 1's buffers; each file holds its own step."""
    engine = trained_engine(1)
    handed_out = HandedOut(monkeypatch)
    release = held_writer(engine)
    checkpointer = Checkpointer(tmp_path, asynchronous=True)
    expected = {1: engine_state(engine)}
    handed_out.next_save()
    checkpointer.save(engine, 1, {"step": 1})
    train_step(engine, 1)
    expected[2] = engine_state(engine)
    handed_out.next_save()
    second = threading.Thread(target=checkpointer.save, args=(engine, 2, {"step": 2}))
    second.start()
    second.join(1.0)
    assert second.is_alive() and handed_out.per_save[1] == []  # nothing overwritten yet
    release.set()
    second.join(60)
    checkpointer.wait()
    assert handed_out.pointers(1) == handed_out.pointers(0)
    for step in (1, 2):
        assert_files_hold(tmp_path / tag_for(step), expected[step])


def test_short_of_host_memory_the_kept_buffers_go_and_a_later_save_stages_again(
    single_rank, tmp_path, monkeypatch
):
    engine = trained_engine(1)
    checkpointer = Checkpointer(tmp_path, asynchronous=True)
    checkpointer.save(engine, 1, {"step": 1})
    checkpointer.wait()
    kept = checkpointer._staging.kept_bytes
    assert kept > 0
    budget = writer_module.host_copy_budget
    monkeypatch.setattr(writer_module, "host_copy_budget", lambda ranks_per_node, staging: 100)
    checkpointer.save(engine, 2, {"step": 2})
    assert checkpointer._staging.kept_bytes == 0  # let go before the files were written
    checkpointer.wait()
    assert checkpointer._staging.kept_bytes == 0
    monkeypatch.setattr(writer_module, "host_copy_budget", budget)
    checkpointer.save(engine, 3, {"step": 3})
    checkpointer.wait()
    assert checkpointer._staging.kept_bytes == kept
    assert [examine(tmp_path / tag_for(s), verify=True)[0] for s in (1, 2, 3)] == [COMPLETE] * 3


def first_tensor(value) -> torch.Tensor | None:
    if isinstance(value, torch.Tensor) and value.numel() > 0:
        return value
    items = value.values() if isinstance(value, dict) else value
    if isinstance(value, dict | list | tuple):
        for item in items:
            found = first_tensor(item)
            if found is not None:
                return found
    return None


@pytest.mark.parametrize("when", ["in the training thread", "in the writer's thread"])
def test_a_host_copy_changed_between_the_copy_and_the_write_is_not_committed(
    single_rank, tmp_path, when
):
    """A byte of a staged tensor changes after the copy, before its file is written (a stray
    write into the buffer, a bit flipped in host memory): the file written from it would be
    self-consistent, so checksums of the written files cannot see it; the copy's own can."""
    engine = trained_engine(2)
    writer, changed = engine.checkpoint_engine, []
    ready = threading.Event()
    save = writer.save

    def change_then_save(state_dict, path):
        assert ready.wait(60), "never released"
        if when == "in the writer's thread" and not changed:
            changed.append(path)
            staged.view(-1)[0] += 1.0
        save(state_dict, path)

    writer.save = change_then_save
    checkpointer = Checkpointer(tmp_path, asynchronous=True)
    checkpointer.save(engine, 2, {"step": 2})
    # The first tensor copied: its file is the first written.
    staged = first_tensor([buffer for _, buffer in checkpointer._staging._in_use])
    if when == "in the training thread":  # save() returned, the write not begun
        staged.view(-1)[0] += 1.0
    ready.set()
    with pytest.raises(CheckpointError, match="changed between the copy and the write"):
        checkpointer.wait()
    assert not (tmp_path / tag_for(2)).exists()  # nothing half-trusted is left
