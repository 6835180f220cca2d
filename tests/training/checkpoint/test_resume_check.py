"""A run resumed with a change that cannot convert (another precision; another ZeRO stage or
tensor degree from a stage 0 checkpoint that does not name its parameters) stops once, in
one line, before any rank starts, whether its checkpoints are on this disk or only in S3;
the same run with another world size still resumes (universal checkpoint), as one at
another ZeRO stage does (tests/training/test_resume.py)."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from tests.training.checkpoint_engine import build_engine, train_step
from tests.training.jobs import TINY, job_command, job_env
from tests.training.multirank import REPO_ROOT
from training.checkpoint.checkpointer import Checkpointer
from training.checkpoint.layout import PARAMETER_GROUPS_KEY
from training.checkpoint.resume_check import refusal
from training.checkpoint.s3 import S3Mirror
from training.spec.config import ConfigError

pytestmark = pytest.mark.multiprocess


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


FP32_RESUMES = "resume it with --set precision.bf16=false --set precision.fp16=false"


@pytest.mark.slow(reason="real DeepSpeed jobs resumed with another setup", seconds=80)
def test_another_precision_stops_once_naming_the_change_and_the_ways_on(trained):
    result = _train(trained, "train.steps=12", "zero.stage=2", "precision.bf16=true")
    assert result.returncode == 2
    assert result.stderr == (
        f"error: {trained}/checkpoints/step_00000010 was saved with precision fp32 (this run: "
        f"bf16), which DeepSpeed cannot load into this run: {FP32_RESUMES}, start over with "
        "--fresh (the old run is kept aside), or give the new setup its own run.name (a run "
        "folder of its own)\n"
    )


@pytest.mark.slow(reason="real DeepSpeed jobs resumed with another setup", seconds=80)
def test_with_the_checkpoints_only_in_s3_another_precision_stops_once(trained, tmp_path, s3_uri):
    """A new node: an empty checkpoint folder, the run's checkpoints in S3 (as its first node
    uploaded them). Without reading S3's manifest, a change that cannot convert failed on
    every rank inside DeepSpeed's load."""
    tag = "step_00000010"
    S3Mirror.from_uri(s3_uri).upload(trained / "checkpoints" / tag, tag)
    result = _train(
        tmp_path, "train.steps=12", "zero.stage=2", "precision.bf16=true", TRAIN_S3_URI=s3_uri
    )
    assert result.returncode == 2
    assert result.stderr.startswith(
        f"error: {s3_uri}/{tag} was saved with precision fp32 (this run: bf16), which "
        f"DeepSpeed cannot load into this run: {FP32_RESUMES}, "
    )
    assert not list((tmp_path / "checkpoints").glob("step_*"))  # nothing fetched or trained


@pytest.mark.slow(reason="real DeepSpeed jobs resumed with another setup", seconds=80)
def test_an_engine_of_another_precision_is_refused_in_the_same_words_before_deepspeed_loads(
    single_rank, tmp_path
):
    """The ranks' own check, for a checkpoint the launcher could not read (S3 out of reach
    then): the same sentence, not DeepSpeed's empty load error."""
    engine = build_engine(zero_stage=2)
    train_step(engine, 0)
    Checkpointer(tmp_path).save(engine, 1, {"step": 1})
    with pytest.raises(
        ConfigError, match=r"step_00000001 was saved with precision fp32 \(this run: bf16\)"
    ):
        Checkpointer(tmp_path).resume(build_engine(zero_stage=2, bf16=True))


def test_a_stage_or_tensor_change_is_refused_only_where_it_cannot_convert():
    """Any change of ZeRO stage (0 to 3) and tensor degree converts, but from a stage 0
    manifest that does not name its parameters (older ones did not)."""
    names = {PARAMETER_GROUPS_KEY: [["0.weight"], ["0.bias"]]}

    def refused(record: dict, zero_stage: int, tensor: int = 1) -> str | None:
        return refusal("ckpt", record, zero_stage=zero_stage, precision="fp32", tensor=tensor)

    loads = [
        ({"zero_stage": 1}, 3, 1),
        ({"zero_stage": 0, **names}, 2, 1),
        ({"zero_stage": 0, **names}, 2, 2),
        ({"zero_stage": 0, "tensor": 2, **names}, 0, 1),
        ({"zero_stage": 3}, 0, 1),
        ({"zero_stage": 2}, 0, 2),
        ({"zero_stage": 0, "tensor": 2}, 0, 2),  # a new world size only: nothing converts
    ]
    for record, stage, tensor in loads:
        assert refused(record, stage, tensor) is None, (record, stage, tensor)
    assert refused({"zero_stage": 0}, 2).startswith(
        "ckpt was saved with zero.stage 0 (this run: 2), which DeepSpeed cannot load into this "
        "run: resume it with --set zero.stage=0, "
    )
    assert refused({"zero_stage": 0, "tensor": 2}, 1, tensor=1).startswith(
        "ckpt was saved with zero.stage 0 (this run: 1), parallel.tensor 2 (this run: 1), "
        "which DeepSpeed cannot load into this run: resume it with --set zero.stage=0 "
        "--set parallel.tensor=2, "
    )
    assert "resume it with --set precision.bf16=true --set precision.fp16=false," in refusal(
        "ckpt", {"zero_stage": 2, "precision": "bf16"}, zero_stage=2, precision="fp32"
    )


@pytest.mark.slow(reason="real DeepSpeed jobs resumed with another setup", seconds=80)
def test_the_same_setup_on_one_rank_resumes(trained, tmp_path):
    run = tmp_path / "run"  # a copy: the module's other tests read the run as trained
    shutil.copytree(trained, run)
    result = _train(run, "train.steps=12", "zero.stage=2", TRAIN_NPROC_PER_NODE="1")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "resumed from" in result.stderr and "step 10" in result.stderr
