"""Damaged checkpoint files in a real 2-rank job: the run resumes from the previous
checkpoint, and its losses from there equal a clean run's."""

from __future__ import annotations

import shutil

import pytest

from tests.training.damage import TARGETS, damage
from tests.training.jobs import TINY, run_job, shared_run
from training.checkpoint.layout import tag_for

pytestmark = pytest.mark.multiprocess

STEPS = 16
JOB = (*TINY, "zero.stage=2", f"train.steps={STEPS}", "checkpoint.every_steps=4")


@pytest.mark.parametrize("target", [*TARGETS, "truncation"])
def test_a_damaged_newest_checkpoint_resumes_from_the_previous_with_clean_losses(
    tmp_path, tmp_path_factory, target
):
    """Injects: the newest checkpoint (step 12) of a clean run, one file damaged in place
    (same-size byte flips in the model file, rank 1's optimizer shard or the manifest,
    or a truncated model file). Proves: the job warns naming that file, resumes from
    step 8, and steps 9..16 have exactly the clean run's losses."""
    clean = shared_run(tmp_path_factory, *JOB)
    for step in (8, 12):
        source = clean.output_dir / "checkpoints" / tag_for(step)
        shutil.copytree(source, tmp_path / "checkpoints" / tag_for(step))
    name = damage(tmp_path / "checkpoints" / tag_for(12), target)

    resumed = run_job(tmp_path, *JOB)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    warning = next(line for line in resumed.stderr.splitlines() if "is damaged" in line)
    assert tag_for(12) in warning and name in warning
    assert f"resumed from {tmp_path / 'checkpoints' / tag_for(8)} at step 8" in resumed.stderr
    got = {r["step"]: r["loss"] for r in resumed.metrics}
    want = {r["step"]: r["loss"] for r in clean.metrics if r["step"] > 8}
    assert sorted(got) == list(range(9, STEPS + 1))
    for step, loss in want.items():
        assert got[step] == pytest.approx(loss, rel=1e-6, abs=1e-7), step
