"""Spot notices at awkward moments: during a checkpoint, twice, and after the end."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.training.fake_imds import FakeImds
from tests.training.faults.injection import fault_env
from tests.training.jobs import TINY, job_env, run_job, start_job, wait_while_running
from training.checkpoint.layout import COMPLETE, committed_tags, examine, tag_for

pytestmark = pytest.mark.multiprocess

PAUSE_S = 8  # longer than the spot poller's 5 s interval: the notice lands in the save


def paused_save_env(tmp_path: Path, imds: FakeImds, at: int) -> dict[str, str]:
    """Rank 0 pauses after the ``at``-th checkpoint file it writes (a slow save)."""
    paused = fault_env("save", at=at, action="pause", flag=tmp_path / "paused", pause_s=PAUSE_S)
    return job_env(tmp_path, TRAIN_SPOT_ENDPOINT=imds.url, **paused)


def wait_for_pause(tmp_path: Path, job) -> None:
    wait_while_running((tmp_path / "paused").exists, job, "the save pause")


def test_a_notice_during_a_checkpoint_and_again_stops_once_with_both_committed(tmp_path):
    """Injects: a spot notice while rank 0 is inside the save of step 4, then a second,
    later notice. Proves: that save completes, the ranks stop after the next step with a
    second checkpoint, exit 75, one stop request; both checkpoints verify."""
    # A blocking save: training waits in it (test_async_checkpoints.py: one in the background).
    overrides = (
        *TINY,
        "train.steps=1000",
        "checkpoint.every_steps=4",
        "checkpoint.asynchronous=false",
    )
    with FakeImds() as imds:
        job = start_job(tmp_path, *overrides, env=paused_save_env(tmp_path, imds, at=1))
        try:
            wait_for_pause(tmp_path, job)
            imds.notify("terminate", "2026-12-01T08:00:00Z")
            wait_while_running(imds.notice_read, job, "the notice read", timeout_s=30)
            imds.notify("terminate", "2026-12-01T08:00:30Z")  # EC2 updates the time
            _, stderr = job.communicate(timeout=180)
        finally:
            job.kill()
    assert job.returncode == 75, stderr[-3000:]
    assert stderr.count("stop requested (spot interruption") == 1
    assert "terminate at 2026-12-01T08:00:00Z" in stderr
    root = tmp_path / "checkpoints"
    assert committed_tags(root) == [tag_for(4), tag_for(5)]
    assert all(examine(root / tag, verify=True)[0] == COMPLETE for tag in committed_tags(root))


@pytest.mark.slow(reason="a real 2-rank job given a spot notice", seconds=70)
def test_a_notice_after_the_last_step_ends_done_not_interrupted(tmp_path):
    """Injects: a spot notice during the final checkpoint (after the last step), still
    pending when the same command runs again. Proves: exit 0 both times (the job is
    done: nothing to requeue), the final checkpoint verifies, nothing is retrained."""
    overrides = (*TINY, "train.steps=6", "checkpoint.every_steps=3")
    with FakeImds() as imds:
        # Rank 0 writes 2 files per save: the 3rd is the first of step 6's save.
        job = start_job(tmp_path, *overrides, env=paused_save_env(tmp_path, imds, at=3))
        try:
            wait_for_pause(tmp_path, job)
            imds.notify("terminate", "2026-12-01T08:00:00Z")
            _, stderr = job.communicate(timeout=180)
        finally:
            job.kill()
        assert job.returncode == 0, stderr[-3000:]
        root = tmp_path / "checkpoints"
        assert committed_tags(root)[-1] == tag_for(6)
        assert examine(root / tag_for(6), verify=True)[0] == COMPLETE

        again = run_job(tmp_path, *overrides, env=job_env(tmp_path, TRAIN_SPOT_ENDPOINT=imds.url))
    assert again.returncode == 0, again.stderr[-3000:]
    assert "already at step 6" in again.stderr
