"""SIGKILL at seeded moments (mid-step, mid-save, mid-upload, mid-commit): every restart
resumes from the last committed checkpoint, and every loss equals a clean run's."""

from __future__ import annotations

import random
import signal
import time
from pathlib import Path

import pytest

from tests.training.faults.injection import fault_env
from tests.training.jobs import TINY, job_env, read_metrics, shared_run, start_job
from training.checkpoint.layout import committed_tags
from training.checkpoint.s3 import S3Mirror

# Six job starts: longer than the suite's default per-test limit.
pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(1800)]

STEPS = 40
JOB = (*TINY, "zero.stage=2", f"train.steps={STEPS}", "checkpoint.every_steps=2")
SEED = 20261201
# (point, the range of FAULT_AT): small enough that each moment comes within a few
# checkpoints of a restart, so every attempt is cut short.
MOMENTS = {"step": (1, 4), "save": (1, 4), "upload": (1, 6), "commit": (1, 3)}


def seeded_moments(count: int) -> list[tuple[str, int]]:
    rng = random.Random(SEED)
    points = [*MOMENTS] * -(-count // len(MOMENTS))
    rng.shuffle(points)
    return [(point, rng.randint(*MOMENTS[point])) for point in points[:count]]


def last_step(output_dir: Path) -> int:
    records = read_metrics(output_dir)
    return records[-1]["step"] if records else 0


@pytest.mark.slow(reason="kill -9 at seeded moments of real 2-rank jobs, each resumed", seconds=250)
def test_sigkill_at_seeded_moments_always_resumes_to_the_clean_losses(
    tmp_path, tmp_path_factory, s3_uri
):
    """Injects: 4 SIGKILLs of the whole job (launcher and ranks), one at each kind of moment,
    in a seeded order and at seeded points:
    at a training step (the launcher killed from outside), and from inside rank 0 right
    after a checkpoint file is written, just before a file is uploaded to S3, and right
    after the manifest or the pointer is written. Proves: each restart resumes from a
    committed checkpoint, every step's loss (repeated steps too) equals the clean run's,
    the run ends at its last step, and S3's newest committed copy is complete."""
    clean = {r["step"]: r["loss"] for r in shared_run(tmp_path_factory, *JOB).metrics}
    kills = 0
    for point, at in seeded_moments(len(MOMENTS)):
        env = job_env(tmp_path, TRAIN_S3_URI=s3_uri)
        if point != "step":
            env.update(fault_env(point, at=at))
        start = last_step(tmp_path)
        job = start_job(tmp_path, *JOB, env=env)
        try:
            if point == "step":
                deadline = time.monotonic() + 180
                while last_step(tmp_path) < start + at and job.poll() is None:
                    assert time.monotonic() < deadline, "no progress"
                    time.sleep(0.01)
                job.send_signal(signal.SIGKILL)  # the launcher; the ranks die with it
            _, stderr = job.communicate(timeout=180)
        finally:
            job.kill()
        if job.returncode == 0:
            break  # the run reached its end before this moment came
        assert job.returncode == -signal.SIGKILL, stderr[-3000:]
        kills += 1
    assert kills == len(MOMENTS)

    final = start_job(tmp_path, *JOB, env=job_env(tmp_path, TRAIN_S3_URI=s3_uri))
    _, stderr = final.communicate(timeout=240)
    assert final.returncode == 0, stderr[-3000:]
    records = read_metrics(tmp_path)
    assert {r["step"] for r in records} == set(range(1, STEPS + 1))
    for record in records:
        assert record["loss"] == pytest.approx(clean[record["step"]], rel=1e-6, abs=1e-7), record
    assert committed_tags(tmp_path / "checkpoints")[-1] == f"step_{STEPS:08d}"
    assert S3Mirror.from_uri(s3_uri).latest_tag() == f"step_{STEPS:08d}"
