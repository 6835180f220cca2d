"""A resumed job equals the uninterrupted job, step for step: after SIGTERM, and on
another number of ranks."""

from __future__ import annotations

import shutil
import signal
import time

import pytest

from tests.training.jobs import (
    NO_DROPOUT,
    STEPS,
    TINY,
    job_env,
    read_metrics,
    run_job,
    shared_run,
    start_job,
)

pytestmark = pytest.mark.multiprocess

JOB = (*TINY, "zero.stage=2")  # dropout on and several epochs: see TINY


@pytest.mark.slow(
    reason="real 2-rank jobs stopped and resumed against an uninterrupted one", seconds=120
)
def test_stopped_and_resumed_run_equals_the_uninterrupted_one(tmp_path, tmp_path_factory):
    baseline = shared_run(tmp_path_factory, *JOB)

    out = tmp_path / "interrupted"
    process = start_job(out, *JOB)
    deadline = time.monotonic() + 180
    while not read_metrics(out) or read_metrics(out)[-1]["step"] < 5:
        assert process.poll() is None, process.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "the job never reached step 5"
        time.sleep(0.02)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 75, stderr[-3000:]
    stopped_at = read_metrics(out)[-1]["step"]
    assert 5 <= stopped_at < STEPS
    assert (out / "checkpoints" / f"step_{stopped_at:08d}" / "commit.json").is_file()

    resumed = run_job(out, *JOB)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resumed from {out / 'checkpoints'}/step_{stopped_at:08d}" in resumed.stderr

    combined, expected = resumed.metrics, baseline.metrics
    assert [r["step"] for r in combined] == list(range(1, STEPS + 1))  # none twice or missing
    for got, want in zip(combined, expected, strict=True):
        position = (got["epoch"], got["samples_seen_in_epoch"])
        assert position == (want["epoch"], want["samples_seen_in_epoch"]), got["step"]
        assert got["loss"] == pytest.approx(want["loss"], rel=1e-6, abs=1e-7), got["step"]
    assert {r["epoch"] for r in combined} == {0, 1, 2}


@pytest.mark.slow(
    reason="real 2-rank jobs stopped and resumed against an uninterrupted one", seconds=120
)
def test_resume_on_one_rank_continues_a_two_rank_run(tmp_path, tmp_path_factory):
    """A replacement machine with fewer GPUs: the 2-rank checkpoint of step 6 is loaded
    on 1 rank (through a universal checkpoint), which then takes both ranks' samples
    (accumulating 2 micro-batches for the fixed global batch of 8)."""
    baseline = shared_run(tmp_path_factory, *NO_DROPOUT)
    step_6 = baseline.output_dir / "checkpoints" / "step_00000006"
    shutil.copytree(step_6, tmp_path / "checkpoints" / step_6.name)

    resumed = run_job(tmp_path, *NO_DROPOUT, env=job_env(tmp_path, TRAIN_NPROC_PER_NODE="1"))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "universal" in resumed.stderr
    got, want = resumed.metrics, baseline.metrics[6:]
    assert [r["step"] for r in got] == list(range(7, 13))
    for new, old in zip(got, want, strict=True):
        assert new["samples_seen_in_epoch"] == old["samples_seen_in_epoch"], new["step"]
        assert new["loss"] == pytest.approx(old["loss"], rel=1e-5), new["step"]


# Weight decay on the matrices only (training/engine.py param_groups): two parameter groups
# whose settings differ, which a load that gave every group the first's would lose.
DECAYING = (*NO_DROPOUT, "optimizer.weight_decay=0.1")


@pytest.mark.slow(
    reason="three real jobs: ZeRO-2 on 2 ranks, its checkpoint at ZeRO-3, that one at stage 0 "
    "on 1 rank",
    seconds=120,
)
def test_a_checkpoint_resumes_at_another_zero_stage(tmp_path):
    """ZeRO-2's step 6 resumed at ZeRO-3, whose step 9 is resumed without ZeRO (stage 0) on
    1 rank, each through a universal checkpoint: weights, Adam moments and steps carry over,
    so the losses are the uninterrupted ZeRO-2 run's (fp32: the stages differ only in how
    the same sums are split). Stage 0 to the others: tests/training/checkpoint/
    test_checkpointer.py."""
    baseline = run_job(tmp_path / "zero2", *DECAYING)
    assert baseline.returncode == 0, baseline.stderr[-3000:]

    def resume(name, source, step, *overrides, ranks=2):
        tag = f"step_{step:08d}"
        shutil.copytree(source / "checkpoints" / tag, tmp_path / name / "checkpoints" / tag)
        env = job_env(tmp_path / name, TRAIN_NPROC_PER_NODE=str(ranks))
        done = run_job(tmp_path / name, *DECAYING, *overrides, env=env)
        assert done.returncode == 0, done.stderr[-3000:]
        return done

    zero3 = resume(
        "zero3", tmp_path / "zero2", 6, "zero.stage=3", "train.steps=9", "checkpoint.every_steps=3"
    )
    assert (
        "step_00000006 was saved by tensor 1 x sequence 1 x data 2 at ZeRO stage 2, this run "
        "is tensor 1 x sequence 1 x data 2 at ZeRO stage 3: converted to a universal "
        "checkpoint" in zero3.stderr
    )
    zero0 = resume("zero0", tmp_path / "zero3", 9, "zero.stage=0", ranks=1)
    assert (
        "step_00000009 was saved by tensor 1 x sequence 1 x data 2 at ZeRO stage 3, this run "
        "is tensor 1 x sequence 1 x data 1 at ZeRO stage 0" in zero0.stderr
    )
    got, want = zero3.metrics + zero0.metrics, baseline.metrics[6:]
    assert [r["step"] for r in got] == list(range(7, 13))
    for new, old in zip(got, want, strict=True):
        assert new["samples_seen_in_epoch"] == old["samples_seen_in_epoch"], new["step"]
        assert new["loss"] == pytest.approx(old["loss"], rel=1e-5), new["step"]
