"""Checkpointer against real DeepSpeed engines (CPU, gloo), local disk and moto's S3."""

from __future__ import annotations

import json
import logging
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
import xxhash

from tests.training.checkpoint_engine import build_engine, train_step, weights
from tests.training.damage import flip_bytes
from tests.training.multirank import torchrun, torchrun_nodes
from training.checkpoint.checkpointer import Checkpointer, CheckpointError
from training.checkpoint.layout import (
    COMMIT_MARKER,
    COMPLETE,
    DAMAGED,
    DAMAGED_DIR,
    PARTIAL,
    POINTER_NAME,
    UNIVERSAL_DIR,
    committed_tags,
    examine,
    parse_step,
    tag_for,
)
from training.checkpoint.s3 import S3Mirror

WORKER = Path(__file__).with_name("checkpoint_worker.py")


def trained_engine(steps: int, **kwargs):
    engine = build_engine(**kwargs)
    for step in range(steps):
        train_step(engine, step)
    return engine


def assert_same_weights(a, b):
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    for name in wa:
        assert torch.equal(wa[name], wb[name]), name


def step_dirs(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if parse_step(p.name) is not None)


@pytest.mark.parametrize("zero_stage", [0, 2, 3])
def test_resume_restores_weights_optimizer_step_and_client_state(single_rank, tmp_path, zero_stage):
    original = trained_engine(3, zero_stage=zero_stage)
    checkpointer = Checkpointer(tmp_path)
    state = {"step": 3, "data": {"epoch": 1, "offset": 96}, "rng": torch.get_rng_state()}
    checkpointer.save(original, 3, state)

    # Different initial weights: the load must replace them. (Under ZeRO-3 a checkpoint
    # only loads into a fresh engine, which is how resume is meant to be used.)
    resumed = build_engine(seed=1, zero_stage=zero_stage)
    loaded = checkpointer.resume(resumed)

    assert loaded["step"] == 3 and loaded["data"] == {"epoch": 1, "offset": 96}
    assert torch.equal(loaded["rng"], state["rng"])
    assert resumed.global_steps == original.global_steps == 3
    assert_same_weights(resumed, original)
    # Identical further steps only stay identical when Adam's moments were restored too.
    for step in (3, 4):
        train_step(original, step)
        train_step(resumed, step)
    assert_same_weights(resumed, original)


@pytest.mark.parametrize(
    ("saved", "loaded", "bf16"),
    [(0, 2, False), (3, 1, False), (0, 3, True), (2, 0, True)],
    ids=["0-to-2", "3-to-1", "0-to-3-bf16", "2-to-0-bf16"],
)
def test_a_checkpoint_resumes_at_another_zero_stage_stage_0_included(
    single_rank, tmp_path, saved, loaded, bf16
):
    """Through a universal checkpoint, whichever side stage 0 is on: fp32 and bf16 (whose
    stage 0 optimizer keeps flat fp32 copies, not per-parameter state)."""
    original = trained_engine(3, zero_stage=saved, bf16=bf16)
    Checkpointer(tmp_path).save(original, 3, {"step": 3})

    checkpointer = Checkpointer(tmp_path)
    point = checkpointer.choose_resume(1, zero_stage=loaded)
    assert point.universal and (tmp_path / UNIVERSAL_DIR / "step_00000003").is_dir()
    resumed = build_engine(
        seed=1, zero_stage=loaded, bf16=bf16, load_universal=point.deepspeed_loads_universal
    )
    assert checkpointer.resume(resumed) == {"step": 3}
    assert resumed.global_steps == 3
    assert_same_weights(resumed, original)
    # Two more steps agree only with the fp32 weights, Adam's moments and step carried over.
    for step in (3, 4):
        assert train_step(resumed, step) == pytest.approx(train_step(original, step), rel=1e-6)
    for name, weight in weights(original).items():
        assert torch.allclose(weights(resumed)[name], weight, rtol=1e-6, atol=1e-7), name


def test_weights_alone_would_not_match(single_rank, tmp_path):
    """Control for the test above: without optimizer state the runs drift apart."""
    original = trained_engine(3)
    fresh = build_engine(seed=1)
    with torch.no_grad():
        for mine, theirs in zip(
            fresh.module.parameters(), original.module.parameters(), strict=True
        ):
            mine.copy_(theirs)
    fresh.optimizer._restore_from_bit16_weights()  # ZeRO's fp32 master copy follows the module
    train_step(original, 3)
    train_step(fresh, 3)
    assert any(
        not torch.equal(a, b)
        for a, b in zip(weights(fresh).values(), weights(original).values(), strict=True)
    )


def test_nothing_to_resume_returns_none(single_rank, tmp_path, caplog):
    engine = build_engine()
    before = weights(engine)
    with caplog.at_level(logging.INFO, logger="training.checkpoint"):
        assert Checkpointer(tmp_path / "empty").resume(engine) is None
    assert "starting fresh" in caplog.text
    assert all(torch.equal(before[k], v) for k, v in weights(engine).items())


def test_commit_marker_lists_every_file_and_deepspeed_latest_is_not_written(single_rank, tmp_path):
    step_dir = Checkpointer(tmp_path).save(trained_engine(2), 2, {"step": 2})
    record = json.loads((step_dir / COMMIT_MARKER).read_text())
    on_disk = {
        p.name: {"size": p.stat().st_size, "xxh3_64": xxhash.xxh3_64_hexdigest(p.read_bytes())}
        for p in step_dir.iterdir()
        if p.name != COMMIT_MARKER
    }
    assert record["files"] == on_disk
    assert record["step"] == 2 and record["dp_world_size"] == 1 and record["zero_stage"] == 2
    assert (tmp_path / POINTER_NAME).read_text().strip() == "step_00000002"
    assert not (tmp_path / "latest").exists()
    assert not [p for p in tmp_path.rglob("*.tmp-*")]


def test_folder_without_marker_is_ignored_and_previous_used(single_rank, tmp_path, caplog):
    checkpointer = Checkpointer(tmp_path)
    at_two = trained_engine(2)
    checkpointer.save(at_two, 2, {"step": 2})
    # A save that died before its commit: shards written, the marker only half-way (tmp file).
    newer = trained_engine(4)
    checkpointer.save(newer, 4, {"step": 4})
    marker = tmp_path / tag_for(4) / COMMIT_MARKER
    marker.rename(marker.with_name(f".{COMMIT_MARKER}.tmp-123"))

    resumed = build_engine(seed=1)
    with caplog.at_level(logging.INFO, logger="training.checkpoint"):
        assert checkpointer.resume(resumed)["step"] == 2
    assert f"{tmp_path / tag_for(4)} is uncommitted: no {COMMIT_MARKER}" in caplog.text
    assert_same_weights(resumed, at_two)


def test_truncated_shard_is_ignored_and_previous_used(single_rank, tmp_path, caplog):
    checkpointer = Checkpointer(tmp_path)
    at_two = trained_engine(2)
    checkpointer.save(at_two, 2, {"step": 2})
    checkpointer.save(trained_engine(4), 4, {"step": 4})
    shard = next((tmp_path / tag_for(4)).glob("*optim_states.pt"))
    shard.write_bytes(shard.read_bytes()[:100])

    resumed = build_engine(seed=1)
    with caplog.at_level(logging.WARNING, logger="training.checkpoint"):
        assert checkpointer.resume(resumed)["step"] == 2
    assert f"{shard.name} has 100 bytes" in caplog.text
    assert_same_weights(resumed, at_two)


def test_the_checkpoint_is_chosen_before_the_engine_and_loads_only_into_one_built_for_it(
    single_rank, tmp_path
):
    checkpointer = Checkpointer(tmp_path)
    checkpointer.save(trained_engine(2), 2, {"step": 2})
    point = checkpointer.choose_resume(dp_world_size=1)  # saved by 1 rank: a plain load
    assert (point.tag, point.step, point.universal) == (tag_for(2), 2, False)
    # An engine built for a universal load would read this ZeRO checkpoint wrongly: refused.
    with pytest.raises(
        CheckpointError, match=r"built without DeepSpeed's checkpoint\.load_universal"
    ):
        checkpointer.resume(build_engine(seed=1, load_universal=True))
    assert checkpointer.resume(build_engine(seed=1))["step"] == 2


def test_only_checkpoint_damaged_raises_instead_of_starting_fresh(single_rank, tmp_path):
    checkpointer = Checkpointer(tmp_path)
    checkpointer.save(trained_engine(2), 2, {"step": 2})
    shard = next((tmp_path / tag_for(2)).glob("*optim_states.pt"))
    shard.write_bytes(b"")
    with pytest.raises(CheckpointError, match=f"{tag_for(2)} were committed"):
        checkpointer.resume(build_engine())


def test_only_an_unfinished_first_save_starts_fresh(single_rank, tmp_path, caplog):
    (tmp_path / tag_for(5)).mkdir()
    (tmp_path / tag_for(5) / "mp_rank_00_model_states.pt").write_bytes(b"partial")
    with caplog.at_level(logging.INFO, logger="training.checkpoint"):
        assert Checkpointer(tmp_path).resume(build_engine()) is None
    assert f"{tmp_path / tag_for(5)} is uncommitted" in caplog.text
    assert "starting fresh" in caplog.text


def test_unloadable_committed_checkpoint_raises_instead_of_starting_fresh(single_rank, tmp_path):
    checkpointer = Checkpointer(tmp_path)
    step_dir = checkpointer.save(trained_engine(2), 2, {"step": 2})
    # Same size, garbage content, under a manifest of sizes only (as written before
    # checksums): the manifest is satisfied but torch.load is not.
    states = step_dir / "mp_rank_00_model_states.pt"
    states.write_bytes(b"\0" * states.stat().st_size)
    sizes = {p.name: p.stat().st_size for p in step_dir.iterdir() if p.name != COMMIT_MARKER}
    (step_dir / COMMIT_MARKER).write_text(
        json.dumps(
            {"tag": tag_for(2), "step": 2, "dp_world_size": 1, "zero_stage": 2, "files": sizes}
        )
    )
    with pytest.raises(CheckpointError, match="could not load"):
        checkpointer.resume(build_engine())


def test_checkpoint_of_another_model_raises(single_rank, tmp_path):
    checkpointer = Checkpointer(tmp_path)
    checkpointer.save(trained_engine(1), 1, {"step": 1})
    other = torch.nn.Linear(3, 3)
    import deepspeed

    engine, *_ = deepspeed.initialize(
        model=other,
        model_parameters=other.parameters(),
        config={
            "train_micro_batch_size_per_gpu": 1,
            "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "torch_adam": True}},
            "zero_optimization": {"stage": 2},
        },
    )
    with pytest.raises(CheckpointError, match=tag_for(1)):
        checkpointer.resume(engine)


@pytest.mark.parametrize("damage", ["delete", "garbage", "uncommitted"])
def test_pointer_file_is_not_trusted(single_rank, tmp_path, damage):
    """The pointer is for people and tools; resume scans the commit markers."""
    checkpointer = Checkpointer(tmp_path)
    checkpointer.save(trained_engine(1), 1, {"step": 1})
    newest = trained_engine(3)
    checkpointer.save(newest, 3, {"step": 3})
    pointer = tmp_path / POINTER_NAME
    if damage == "delete":
        pointer.unlink()
    elif damage == "garbage":
        pointer.write_bytes(b"\xff\x00step_9")
    else:
        (tmp_path / tag_for(9)).mkdir()
        pointer.write_text(tag_for(9))
    resumed = build_engine(seed=1)
    assert checkpointer.resume(resumed)["step"] == 3
    assert_same_weights(resumed, newest)


def test_keep_last_prunes_old_and_uncommitted_folders(single_rank, tmp_path):
    checkpointer = Checkpointer(tmp_path, keep_last=2)
    (tmp_path / tag_for(0)).mkdir(parents=True)  # left behind by a crashed run
    engine = build_engine()
    for step in range(1, 6):
        train_step(engine, step)
        checkpointer.save(engine, step, {"step": step})
        assert len(step_dirs(tmp_path)) <= 2
    assert step_dirs(tmp_path) == [tag_for(4), tag_for(5)]


def test_saving_a_committed_step_again_keeps_it(single_rank, tmp_path):
    checkpointer = Checkpointer(tmp_path)
    engine = trained_engine(2)
    step_dir = checkpointer.save(engine, 2, {"step": 2})
    marker = (step_dir / COMMIT_MARKER).read_text()
    train_step(engine, 2)  # a second save of step 2 must not overwrite the first
    assert checkpointer.save(engine, 2, {"step": "again"}) == step_dir
    assert (step_dir / COMMIT_MARKER).read_text() == marker
    assert checkpointer.resume(build_engine())["step"] == 2


def set_aside_here(root: Path) -> list[str]:
    return (
        sorted(p.name for p in (root / DAMAGED_DIR).iterdir())
        if (root / DAMAGED_DIR).is_dir()
        else []
    )


def test_a_damaged_committed_step_is_not_taken_as_saved_but_set_aside_and_written_again(
    single_rank, tmp_path, caplog
):
    """A run that resumed before its newest step reaches that step again; the folder there,
    committed by an earlier run, had bytes flipped (same size) since."""
    engine = trained_engine(2)
    Checkpointer(tmp_path).save(engine, 2, {"step": 2})
    model_file = tmp_path / tag_for(2) / "mp_rank_00_model_states.pt"
    flip_bytes(model_file, count=64)

    with caplog.at_level(logging.INFO, logger="training.checkpoint"):
        Checkpointer(tmp_path).save(engine, 2, {"step": 2})
    assert "already committed" not in caplog.text
    assert examine(tmp_path / tag_for(2), verify=True) == (
        COMPLETE,
        "every file present and verified",
    )
    (aside,) = set_aside_here(tmp_path)
    assert aside.startswith(f"{tag_for(2)}.")  # kept for inspection, with the damage in it
    assert examine(tmp_path / DAMAGED_DIR / aside, verify=True)[0] == DAMAGED
    (line,) = [r.getMessage() for r in caplog.records if "is damaged" in r.getMessage()]
    assert str(tmp_path / tag_for(2)) in line and model_file.name in line and aside in line
    resumed = build_engine(seed=1)
    assert Checkpointer(tmp_path).resume(resumed)["step"] == 2
    assert_same_weights(resumed, engine)


def test_resume_sets_a_damaged_newest_checkpoint_aside_and_takes_the_one_before(
    single_rank, tmp_path
):
    checkpointer = Checkpointer(tmp_path)
    at_two = trained_engine(2)
    checkpointer.save(at_two, 2, {"step": 2})
    checkpointer.save(trained_engine(4), 4, {"step": 4})
    flip_bytes(tmp_path / tag_for(4) / "mp_rank_00_model_states.pt", count=64)

    resumed = build_engine(seed=1)
    assert Checkpointer(tmp_path).resume(resumed)["step"] == 2
    assert_same_weights(resumed, at_two)
    assert step_dirs(tmp_path) == [tag_for(2)]  # step 4 is written anew when reached
    assert [name.split(".")[0] for name in set_aside_here(tmp_path)] == [tag_for(4)]


def test_with_every_checkpoint_set_aside_a_later_start_still_refuses_to_start_fresh(
    single_rank, tmp_path
):
    checkpointer = Checkpointer(tmp_path)
    checkpointer.save(trained_engine(2), 2, {"step": 2})
    flip_bytes(tmp_path / tag_for(2) / "mp_rank_00_model_states.pt", count=64)
    for _ in range(2):  # the start that set it aside, and the one after
        with pytest.raises(CheckpointError, match=f"set aside in {tmp_path / DAMAGED_DIR}"):
            Checkpointer(tmp_path).resume(build_engine())


def test_a_damaged_universal_conversion_is_set_aside_and_converted_again(single_rank, tmp_path):
    """A checkpoint resumed on another number of ranks goes through its universal
    conversion, which later resumes reuse; bytes flipped in a converted tensor file."""
    engine = trained_engine(2)
    Checkpointer(tmp_path).save(engine, 2, {"step": 2})
    # Saved by 1 rank, chosen for 2: converted (the conversion does not depend on the
    # ranks that load it).
    point = Checkpointer(tmp_path).choose_resume(dp_world_size=2)
    assert point.universal
    converted = tmp_path / UNIVERSAL_DIR / tag_for(2)
    fp32 = sorted(converted.rglob("fp32.pt"))[0]
    flip_bytes(fp32, count=64)

    checkpointer = Checkpointer(tmp_path)
    assert checkpointer.choose_resume(dp_world_size=2).universal
    assert examine(converted, verify=True)[0] == COMPLETE
    assert [name.split(".")[0] for name in set_aside_here(tmp_path)] == [
        f"{UNIVERSAL_DIR}-{tag_for(2)}"
    ]
    resumed = build_engine(seed=1, load_universal=True)
    assert checkpointer.resume(resumed)["step"] == 2
    assert_same_weights(resumed, engine)


def test_a_folder_missing_files_on_a_root_every_rank_shares_is_no_checkpoint(single_rank, tmp_path):
    """A download from S3 cut short leaves a manifest and some files: on a shared root that
    is not this node's part of a checkpoint, so the step is written again when reached."""
    engine = trained_engine(2)
    Checkpointer(tmp_path).save(engine, 2, {"step": 2})
    next((tmp_path / tag_for(2)).glob("*optim_states.pt")).unlink()
    assert examine(tmp_path / tag_for(2))[0] == PARTIAL
    Checkpointer(tmp_path).save(engine, 2, {"step": 2})
    assert examine(tmp_path / tag_for(2), verify=True)[0] == COMPLETE


def test_stale_uncommitted_folder_of_the_same_step_is_replaced(single_rank, tmp_path):
    stale = tmp_path / tag_for(2)
    stale.mkdir()
    (stale / "mp_rank_00_model_states.pt").write_bytes(b"half written")
    engine = trained_engine(2)
    Checkpointer(tmp_path).save(engine, 2, {"step": 2})
    resumed = build_engine(seed=1)
    assert Checkpointer(tmp_path).resume(resumed)["step"] == 2
    assert_same_weights(resumed, engine)


def test_keep_last_must_be_positive(tmp_path):
    with pytest.raises(ValueError, match="keep_last=0"):
        Checkpointer(tmp_path, keep_last=0)


# ------------------------------------------------------------------ S3 mirror


def test_wiped_local_dir_resumes_from_s3(single_rank, tmp_path, s3_uri, caplog):
    mirror = S3Mirror.from_uri(s3_uri)
    engine = trained_engine(3)
    Checkpointer(tmp_path / "node-a", mirror=mirror).save(engine, 3, {"step": 3})
    assert mirror.latest_tag() == tag_for(3)

    fresh_root = tmp_path / "node-b"  # a new spot instance: empty local disk
    resumed = build_engine(seed=1)
    with caplog.at_level(logging.INFO, logger="training.checkpoint"):
        assert Checkpointer(fresh_root, mirror=mirror).resume(resumed)["step"] == 3
    assert f"newest checkpoint: {tag_for(3)} (in {fresh_root}: none, in S3: {tag_for(3)})" in (
        caplog.text
    )
    assert f"fetching {tag_for(3)} from {s3_uri}" in caplog.text
    assert (fresh_root / tag_for(3) / COMMIT_MARKER).is_file()
    assert_same_weights(resumed, engine)


def test_s3_newer_than_local_wins(single_rank, tmp_path, s3_uri):
    mirror = S3Mirror.from_uri(s3_uri)
    root = tmp_path / "ckpt"
    engine = trained_engine(2)
    Checkpointer(root, mirror=mirror).save(engine, 2, {"step": 2})
    stale_copy = tmp_path / "stale"
    shutil.copytree(root, stale_copy)
    train_step(engine, 2)
    Checkpointer(root, mirror=mirror).save(engine, 3, {"step": 3})

    resumed = build_engine(seed=1)
    assert Checkpointer(stale_copy, mirror=mirror).resume(resumed)["step"] == 3
    assert_same_weights(resumed, engine)


def test_missing_local_file_is_fetched_alone_from_s3(single_rank, tmp_path, s3_uri, caplog):
    mirror = S3Mirror.from_uri(s3_uri)
    engine = trained_engine(2)
    step_dir = Checkpointer(tmp_path, mirror=mirror).save(engine, 2, {"step": 2})
    lost = next(step_dir.glob("*optim_states.pt"))
    lost.unlink()
    kept = step_dir / "mp_rank_00_model_states.pt"
    kept_inode = kept.stat().st_ino
    assert examine(step_dir)[0] == PARTIAL and committed_tags(tmp_path) == []

    resumed = build_engine(seed=1)
    with caplog.at_level(logging.INFO):
        assert Checkpointer(tmp_path, mirror=mirror).resume(resumed)["step"] == 2
    assert "(1 of 2 files fetched)" in caplog.text
    assert kept.stat().st_ino == kept_inode  # the file already here was not fetched again
    assert examine(step_dir)[0] == COMPLETE
    assert_same_weights(resumed, engine)


def test_local_newer_than_s3_is_used_without_download(single_rank, tmp_path, s3_uri):
    mirror = S3Mirror.from_uri(s3_uri)
    root = tmp_path / "ckpt"
    Checkpointer(root, mirror=mirror).save(trained_engine(1), 1, {"step": 1})
    local_only = trained_engine(2)
    Checkpointer(root).save(local_only, 2, {"step": 2})  # e.g. its upload failed
    assert mirror.latest_tag() == tag_for(1)
    resumed = build_engine(seed=1)
    assert Checkpointer(root, mirror=mirror).resume(resumed)["step"] == 2
    assert_same_weights(resumed, local_only)


def test_unreachable_s3_at_resume_raises_rather_than_guessing(single_rank, tmp_path, s3_uri):
    """S3 may hold a newer checkpoint than the local one: without S3, resume does not guess."""
    mirror = S3Mirror.from_uri(s3_uri)
    Checkpointer(tmp_path, mirror=mirror).save(trained_engine(1), 1, {"step": 1})
    gone = S3Mirror.from_uri(f"s3://no-such-bucket-{mirror.bucket}/runs/test")
    with pytest.raises(
        CheckpointError, match=f"cannot list the checkpoints in {gone.uri}: .*NoSuchBucket"
    ):
        Checkpointer(tmp_path, mirror=gone).resume(build_engine())


def test_s3_is_pruned_to_keep_last(single_rank, tmp_path, s3_uri):
    mirror = S3Mirror.from_uri(s3_uri)
    checkpointer = Checkpointer(tmp_path, keep_last=2, mirror=mirror)
    engine = build_engine()
    for step in range(1, 5):
        train_step(engine, step)
        checkpointer.save(engine, step, {"step": step})
    assert mirror.tags() == [tag_for(3), tag_for(4)]
    assert mirror.latest_tag() == tag_for(4)


def test_failed_upload_keeps_the_local_commit(single_rank, tmp_path, s3_uri, caplog):
    import boto3

    mirror = S3Mirror.from_uri(s3_uri)
    boto3.client("s3").delete_bucket(Bucket=mirror.bucket)  # every upload now fails
    engine = trained_engine(2)
    with caplog.at_level(logging.ERROR, logger="training.checkpoint"):
        step_dir = Checkpointer(tmp_path, mirror=mirror).save(engine, 2, {"step": 2})
    assert f"could not mirror {tmp_path / tag_for(2)} to {s3_uri}" in caplog.text
    assert (step_dir / COMMIT_MARKER).is_file()


# --------------------------------------------------------- world-size change


@pytest.mark.multiprocess
@pytest.mark.slow(reason="real 2-rank DeepSpeed jobs that save, fail or resume", seconds=120)
def test_two_node_zero2_checkpoint_resumes_on_one_rank_from_s3(tmp_path, s3_uri):
    """2 one-rank "nodes", each with its own disk, save (ZeRO-2): each disk keeps that node's
    part and S3 the whole. 1 rank on a fresh disk then resumes from S3 through a universal
    checkpoint, and trains on."""
    disks = str(tmp_path / "node{node}")
    saved, resumed = tmp_path / "saved.pt", tmp_path / "resumed.pt"
    for node in torchrun_nodes(WORKER, 2, "save", disks, str(saved), s3_uri):
        assert node.wait(timeout=240) == 0

    tag = tag_for(4)
    listed = json.loads((tmp_path / "node0" / tag / COMMIT_MARKER).read_text())["files"]
    parts = [
        {p.name for p in (tmp_path / f"node{n}" / tag).iterdir()} - {COMMIT_MARKER} for n in (0, 1)
    ]
    assert parts[0] and parts[1] and not parts[0] & parts[1]
    assert parts[0] | parts[1] == set(listed)
    assert [examine(tmp_path / f"node{n}" / tag)[0] for n in (0, 1)] == [PARTIAL, PARTIAL]
    assert S3Mirror.from_uri(s3_uri).latest_tag() == tag

    resume = torchrun(WORKER, 1, "resume", str(tmp_path / "fresh"), str(resumed), s3_uri)
    assert resume.wait(timeout=240) == 0
    before, after = torch.load(saved), torch.load(resumed)
    assert after["client_state"] == {"step": 4, "note": "saved by 2 ranks"}
    assert after["global_steps_after_load"] == 4
    for name, tensor in before["weights"].items():
        assert torch.equal(after["weights_after_load"][name], tensor), name
    assert after["global_steps_after_training"] == 6
    assert any(
        not torch.equal(after["weights_after_training"][n], t) for n, t in before["weights"].items()
    )
    assert examine(tmp_path / "fresh" / tag)[0] == COMPLETE
    converted = tmp_path / "fresh" / UNIVERSAL_DIR / tag
    assert examine(converted)[0] == COMPLETE
    assert (converted / "zero").is_dir()


@pytest.mark.multiprocess
@pytest.mark.slow(reason="real 2-rank DeepSpeed jobs that save, fail or resume", seconds=90)
def test_a_failure_on_rank0_fails_every_rank_instead_of_hanging(tmp_path, s3_uri):
    not_a_folder = tmp_path / "root"
    not_a_folder.write_text("a file where the checkpoint root should be")
    job = torchrun(
        WORKER,
        2,
        "save",
        str(not_a_folder),
        str(tmp_path / "out.pt"),
        s3_uri,
        stderr=subprocess.PIPE,
        text=True,
    )
    _, stderr = job.communicate(timeout=240)
    assert job.returncode != 0
    for rank in (0, 1):
        assert re.search(rf"\[rank{rank}\]: .*CheckpointError: rank 0: FileExistsError", stderr)


@pytest.mark.slow(reason="real 2-rank DeepSpeed jobs that save, fail or resume", seconds=90)
def test_no_recovery_script_that_cannot_run_is_left_beside_the_checkpoints(single_rank, tmp_path):
    # DeepSpeed copies zero_to_fp32.py/zero_to_torch.py into the root of every ZeRO save;
    # they need huggingface_hub, which the trainer does not install (`python -m training
    # export` converts instead). The save leaves only the trainer's own files.
    Checkpointer(tmp_path).save(trained_engine(1, zero_stage=2), 1, {"step": 1})
    assert sorted(p.name for p in tmp_path.iterdir()) == [POINTER_NAME, tag_for(1)]


@pytest.mark.parametrize("asynchronous", [False, True])
def test_a_save_leaves_the_engine_as_deepspeeds_own_save_does(single_rank, tmp_path, asynchronous):
    # Its checkpoint engine and every other attribute are the same objects afterwards: no
    # method or attribute of DeepSpeed's is left replaced, none added beyond DeepSpeed's own.
    ours, plain = trained_engine(1), trained_engine(1)
    before, plain_before = dict(vars(ours)), set(vars(plain))
    checkpointer = Checkpointer(tmp_path / "ours", asynchronous=asynchronous)
    checkpointer.save(ours, 1, {"step": 1})
    checkpointer.wait()
    plain.save_checkpoint(str(tmp_path / "plain"), tag="plain", save_latest=False)
    assert set(vars(ours)) - set(before) == set(vars(plain)) - plain_before
    assert [name for name, value in before.items() if vars(ours)[name] is not value] == []
