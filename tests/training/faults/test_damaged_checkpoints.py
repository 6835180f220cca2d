"""Damaged checkpoint files in a real 2-rank job: the run resumes from the previous
checkpoint, and its losses from there equal a clean run's; the damaged checkpoint is set
aside and written again when the run reaches its step."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.training.damage import TARGETS, damage
from tests.training.jobs import TINY, run_job, shared_run
from training.checkpoint.layout import COMMIT_MARKER, COMPLETE, DAMAGED_DIR, examine, tag_for

pytestmark = [
    pytest.mark.slow(
        reason="a clean 2-rank run, then one resumed run per kind of damage", seconds=120
    ),
    pytest.mark.multiprocess,
]

STEPS = 16
JOB = (*TINY, "zero.stage=2", f"train.steps={STEPS}", "checkpoint.every_steps=4")


@pytest.mark.parametrize("target", [*TARGETS, "truncation"])
def test_a_damaged_newest_checkpoint_resumes_from_the_previous_with_clean_losses(
    tmp_path, tmp_path_factory, target
):
    """Injects: the newest checkpoint (step 12) of a clean run, one file damaged in place
    (same-size byte flips in the model file, rank 1's optimizer shard or the manifest,
    or a truncated model file). Proves: the job warns naming that file, resumes from
    step 8, and steps 9..16 have exactly the clean run's losses; the damaged folder is
    kept aside, and step 12 is written again, the same files as the clean run's."""
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

    rewritten = tmp_path / "checkpoints" / tag_for(12)
    assert examine(rewritten, verify=True)[0] == COMPLETE
    # The weights and the trainer's state (step, data position, RNG) are the clean run's,
    # byte for byte (the optimizer files' pickles differ in DeepSpeed's own bookkeeping).
    model = "mp_rank_00_model_states.pt"
    files = json.loads((rewritten / COMMIT_MARKER).read_text())["files"]
    clean_manifest = clean.output_dir / "checkpoints" / tag_for(12) / COMMIT_MARKER
    assert files[model] == json.loads(clean_manifest.read_text())["files"][model]
    (aside,) = (tmp_path / "checkpoints" / DAMAGED_DIR).iterdir()
    assert aside.name.startswith(f"{tag_for(12)}.") and aside.name in warning
