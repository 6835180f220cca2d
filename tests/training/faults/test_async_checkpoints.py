"""Background checkpoint writes cut short: by SIGKILL (resume from the newest committed
checkpoint, the clean losses), by SIGTERM and by a spot notice (exit 75, the current step
committed)."""

from __future__ import annotations

import random
import re
import signal
from pathlib import Path

import pytest

from tests.training.fake_imds import FakeImds
from tests.training.faults.injection import fault_env
from tests.training.jobs import (
    TINY,
    job_env,
    read_metrics,
    shared_run,
    start_job,
    wait_while_running,
)
from training.checkpoint.layout import (
    COMPLETE,
    UNCOMMITTED,
    committed_tags,
    examine,
    step_dirs,
    tag_for,
)

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(1800)]

STEPS = 24
# Saves are asynchronous by default: every third step's save is written in the background.
JOB = (*TINY, "zero.stage=2", f"train.steps={STEPS}", "checkpoint.every_steps=3")
SEED = 20261202
# Rank 0 writes 2 files per save (model states, its optimizer shard) and calls
# write_atomically twice per commit (manifest, pointer): "save" at N kills after its N-th
# file, "manifest" at an odd N just before a manifest, with every file of that save written.
# Both within a start's first two saves, so that 4 starts never reach the run's end.
MOMENTS = {"save": (1, 4), "manifest": (1, 3)}
PAUSE_S = 10  # longer than the spot poller's 5 s interval: the notice lands in the write


def seeded_moments(count: int) -> list[tuple[str, int]]:
    rng = random.Random(SEED)
    moments = []
    for index in range(count):
        point = [*MOMENTS][index % len(MOMENTS)]
        at = rng.randint(*MOMENTS[point])
        moments.append((point, at | 1 if point == "manifest" else at))
    return moments


@pytest.mark.slow(
    reason="a clean run, then five starts of 2 ranks, four killed mid-save", seconds=180
)
def test_sigkill_during_background_writes_resumes_from_the_newest_committed(
    tmp_path, tmp_path_factory
):
    """Injects: 4 SIGKILLs of the whole job from inside rank 0's background writer, at
    seeded moments: after a checkpoint file, and between the last file and the manifest.
    Proves: each kill leaves the save it cut short uncommitted; the next start resumes
    from the newest committed checkpoint; every step's loss equals the clean run's."""
    clean = {r["step"]: r["loss"] for r in shared_run(tmp_path_factory, *JOB).metrics}
    root = tmp_path / "checkpoints"
    for point, at in seeded_moments(4):
        env = job_env(tmp_path, **fault_env(point, at=at))
        before = committed_tags(root)
        job = start_job(tmp_path, *JOB, env=env)
        try:
            _, stderr = job.communicate(timeout=240)
        finally:
            job.kill()
        assert job.returncode == -signal.SIGKILL, stderr[-3000:]
        if before:
            assert f"resumed from {root / before[-1]} at step" in stderr, stderr[-3000:]
        cut_short = [t for t in step_dirs(root) if examine(root / t)[0] == UNCOMMITTED]
        assert len(cut_short) == 1, step_dirs(root)
        committed = committed_tags(root)
        assert not committed or committed[-1] < cut_short[0]  # the newest committed is older

    final = start_job(tmp_path, *JOB, env=job_env(tmp_path))
    _, stderr = final.communicate(timeout=240)
    assert final.returncode == 0, stderr[-3000:]
    records = read_metrics(tmp_path)
    assert {r["step"] for r in records} == set(range(1, STEPS + 1))
    for record in records:
        assert record["loss"] == pytest.approx(clean[record["step"]], rel=1e-6, abs=1e-7), record
    assert committed_tags(root)[-1] == tag_for(STEPS)


def assert_stopped_with_current_step_committed(tmp_path: Path, stderr: str) -> None:
    root = tmp_path / "checkpoints"
    stopped = int(re.search(r"stopped at step (\d+)", stderr).group(1))
    assert stopped > 3  # trained on while step 3 was being written
    assert read_metrics(tmp_path)[-1]["step"] == stopped
    committed = committed_tags(root)
    assert tag_for(3) in committed and committed[-1] == tag_for(stopped), committed
    assert all(examine(root / tag, verify=True)[0] == COMPLETE for tag in committed)


@pytest.mark.parametrize("how", ["sigterm", "spot notice"])
def test_a_stop_during_a_background_write_exits_75_with_the_current_step_committed(tmp_path, how):
    """Injects: SIGTERM to the launcher, or a spot notice, while rank 0's background
    writer is held inside step 3's save. Proves: the job exits 75; step 3's checkpoint
    completes, and so does the one of the step it stopped at, the newest."""
    overrides = (*JOB, "train.steps=1000")
    with FakeImds() as imds:
        # Rank 0 holds still after the first file of step 3's save.
        flag = tmp_path / "paused"
        paused = fault_env("save", at=1, action="pause", flag=flag, pause_s=PAUSE_S)
        env = job_env(tmp_path, TRAIN_SPOT_ENDPOINT=imds.url, **paused)
        job = start_job(tmp_path, *overrides, env=env)
        try:
            wait_while_running(flag.exists, job, "the write pause")
            if how == "sigterm":
                job.send_signal(signal.SIGTERM)
            else:
                imds.notify("terminate", "2026-12-01T08:00:00Z")
                wait_while_running(imds.notice_read, job, "the notice read", timeout_s=30)
            _, stderr = job.communicate(timeout=180)
        finally:
            job.kill()
    assert job.returncode == 75, stderr[-3000:]
    assert_stopped_with_current_step_committed(tmp_path, stderr)
