"""A run resumed with another ZeRO stage or precision stops once, in one line, before any
rank starts; the same run with another world size still resumes (universal checkpoint)."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.training.jobs import TINY, job_command, job_env
from tests.training.multirank import REPO_ROOT
from training.checkpoint.resume_check import check_resumable
from training.spec.config import ConfigError, load_config


def _train(output_dir, *overrides: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        job_command(*TINY, *overrides),
        env=job_env(output_dir, **env),
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A run of 10 steps at ZeRO-2 in fp32 on 2 ranks, checkpointed at its end."""
    output_dir = tmp_path_factory.mktemp("run")
    result = _train(output_dir, "train.steps=10", "zero.stage=2")
    assert result.returncode == 0, result.stderr[-3000:]
    manifest = json.loads(
        (output_dir / "checkpoints" / "step_00000010" / "commit.json").read_text()
    )
    assert (manifest["zero_stage"], manifest["precision"], manifest["dp_world_size"]) == (
        2,
        "fp32",
        2,
    )
    return output_dir


def test_another_zero_stage_stops_once_naming_the_change_and_the_ways_on(trained):
    result = _train(trained, "train.steps=12", "zero.stage=3")
    assert result.returncode == 2
    assert result.stderr == (
        f"error: {trained}/checkpoints/step_00000010 was saved with zero.stage 2 (this run: 3), "
        "which DeepSpeed cannot load into this run: resume it with --set zero.stage=2, start "
        "over with --fresh (the old run is kept aside), or give the new setup its own run.name "
        "(a run folder of its own)\n"
    )


def test_another_precision_is_named_with_the_flags_that_resume(trained, tmp_path):
    copy = tmp_path / "checkpoints"
    subprocess.run(["cp", "-r", str(trained / "checkpoints"), str(copy)], check=True)
    manifest_path = copy / "step_00000010" / "commit.json"
    manifest = json.loads(manifest_path.read_text())
    # As a bf16 run would have written it (without the manifest's own checksum, which
    # covers the fields and is optional).
    fields = ("tag", "step", "dp_world_size", "zero_stage", "saved_at", "files")
    manifest_path.write_text(json.dumps({**{k: manifest[k] for k in fields}, "precision": "bf16"}))
    config = load_config(None, [*TINY, "zero.stage=2", f"checkpoint.dir={copy}"], env={})
    with pytest.raises(ConfigError) as caught:
        check_resumable(config)
    assert "was saved with precision bf16 (this run: fp32)" in str(caught.value)
    assert "resume it with --set precision.bf16=true --set precision.fp16=false," in str(
        caught.value
    )


def test_the_same_setup_on_one_rank_resumes(trained):
    result = _train(trained, "train.steps=12", "zero.stage=2", TRAIN_NPROC_PER_NODE="1")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "resumed from" in result.stderr and "step 10" in result.stderr
