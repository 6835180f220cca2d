"""`--fresh`: the old run folder is moved aside, never deleted, and the new run starts at step 1."""

from __future__ import annotations

import datetime
import re
import subprocess

import pytest

from tests.training.jobs import TINY, job_command, job_env, read_metrics, run_job
from tests.training.multirank import REPO_ROOT
from training.environment import TrainerEnv
from training.fresh import move_aside
from training.spec.config import ConfigError, load_config

NOW = datetime.datetime(2026, 12, 1, 7, 30, 5, tzinfo=datetime.UTC)


def _config(tmp_path, checkpoints=None):
    overrides = [f"run.output_dir={tmp_path / 'run'}"]
    if checkpoints is not None:
        overrides.append(f"checkpoint.dir={checkpoints}")
    return load_config(None, overrides)


def test_run_folder_moves_aside_with_a_timestamp(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints" / "step_00000003").mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"step": 3}\n')
    moved = move_aside(_config(tmp_path), TrainerEnv(), NOW)
    target = tmp_path / "run.20261201T073005Z"
    assert moved == [(run, target)]
    assert not run.exists()
    assert (target / "metrics.jsonl").read_text() == '{"step": 3}\n'
    assert (target / "checkpoints" / "step_00000003").is_dir()


def test_a_checkpoint_folder_elsewhere_moves_too_and_names_never_collide(tmp_path):
    checkpoints = tmp_path / "elsewhere" / "ckpt"
    checkpoints.mkdir(parents=True)
    (tmp_path / "run").mkdir()
    (tmp_path / "run.20261201T073005Z").mkdir()  # an earlier --fresh in the same second
    moved = dict(move_aside(_config(tmp_path, checkpoints), TrainerEnv(), NOW))
    assert moved[tmp_path / "run"] == tmp_path / "run.20261201T073005Z-1"
    assert moved[checkpoints] == checkpoints.with_name("ckpt.20261201T073005Z")


def test_nothing_to_move_is_fine(tmp_path):
    assert move_aside(_config(tmp_path), TrainerEnv(), NOW) == []


def test_an_s3_mirror_is_refused_before_anything_moves(tmp_path):
    (tmp_path / "run").mkdir()
    with pytest.raises(ConfigError, match="point TRAIN_S3_URI at a new prefix"):
        move_aside(_config(tmp_path), TrainerEnv(s3_uri="s3://bucket/run"), NOW)
    assert (tmp_path / "run").is_dir()


@pytest.mark.multiprocess
def test_fresh_run_starts_over_and_keeps_the_old_one_with_the_cost_in_the_summary(tmp_path):
    out = tmp_path / "run"
    first = run_job(out, *TINY, "train.steps=4")
    assert first.returncode == 0, first.stderr[-3000:]
    command = [*job_command(*TINY, "train.steps=6"), "--fresh"]
    again = subprocess.run(
        command,
        env=job_env(out, TRAIN_USD_PER_HOUR="3.06"),
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert again.returncode == 0, again.stderr[-3000:]
    (old,) = [p for p in tmp_path.iterdir() if p.name.startswith("run.")]
    assert re.fullmatch(r"run\.\d{8}T\d{6}Z", old.name)
    assert [r["step"] for r in read_metrics(old)] == [1, 2, 3, 4]
    assert (old / "checkpoints" / "step_00000004" / "commit.json").is_file()
    # Started from step 1, not resumed from step 4.
    assert [r["step"] for r in read_metrics(out)] == [1, 2, 3, 4, 5, 6]
    assert f"moved {out} aside to {old}" in again.stderr
    summary = next(line for line in again.stdout.splitlines() if line.startswith("done: 6 steps"))
    match = re.search(r"([\d.]+) GPU-hours, \$([\d.]+) at \$3\.06/h", summary)
    assert match is not None, summary
    took = float(re.search(r"in ([\d.]+) s", summary)[1])
    assert float(match[1]) == pytest.approx(2 * took / 3600, abs=0.006)  # two ranks
