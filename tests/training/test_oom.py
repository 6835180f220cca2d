"""Out of memory is a sentence: what the config can change, exit 2 when it is the config."""

from __future__ import annotations

import pytest

from tests.training.jobs import TINY, run_job
from training.oom import explain, remedies
from training.spec.config import load_config, resolve_batch_sizes


def advice(*overrides: str, world_size: int = 8) -> list[str]:
    config = load_config(None, overrides)
    return remedies(config, resolve_batch_sizes(config.train, world_size))


def test_remedies_name_only_what_the_config_can_still_change():
    found = advice("train.micro_batch_size=8", "zero.stage=2")
    assert found == [
        "lower train.micro_batch_size (now 8) and keep train.global_batch_size = 64 so the "
        "accumulation grows",
        "set model.activation_checkpointing = true",
        "raise zero.stage (now 2) to 3",
        "set zero.offload_optimizer = true",
    ]
    everything = advice(
        "train.micro_batch_size=1",
        "model.activation_checkpointing=true",
        "zero.stage=3",
        "zero.offload_optimizer=true",
        "zero.offload_param=true",
    )
    assert everything == []


def test_a_vision_model_is_told_only_what_it_runs_with():
    found = advice(
        "model.preset=resnet-50", "data.kind=image_folder", "data.num_classes=10", "zero.stage=0"
    )
    assert not any("activation_checkpointing" in item for item in found)
    assert "raise zero.stage (now 0) to 1 or 2" in found  # not 3: see test_config


def test_early_is_the_config_later_is_transient():
    config = load_config(None, ["zero.stage=1"])
    batch = resolve_batch_sizes(config.train, 2)
    early = explain(config, batch, step=102, first_step=100)
    late = explain(config, batch, step=140, first_step=100)
    assert (early.exit_code, late.exit_code) == (2, 1)
    assert "this configuration does not fit" in str(early)
    assert "after 40 steps that fitted: likely transient" in str(late)


OOM_MODEL = ("model.builder=tests.training.oom_model:build", "zero.stage=1")


@pytest.mark.multiprocess
def test_an_oom_in_the_first_step_ends_the_job_with_exit_2_and_one_line(tmp_path):
    job = run_job(tmp_path, *TINY, *OOM_MODEL, "model.options={fail_at_call = 1}")
    assert job.returncode == 2, job.stderr[-3000:]
    # One sentence (each rank that ran out of memory says it, the same).
    (line,) = {line for line in job.stderr.splitlines() if line.startswith("error: CUDA")}
    assert line.startswith("error: CUDA out of memory at step 1 (micro batch 4, ZeRO stage 1)")
    for change in ("train.micro_batch_size", "zero.stage", "zero.offload_optimizer"):
        assert change in line
    assert "Traceback" not in job.stderr


@pytest.mark.multiprocess
def test_an_oom_after_steps_that_fitted_exits_1(tmp_path):
    job = run_job(tmp_path, *TINY, *OOM_MODEL, "model.options={fail_at_call = 6}")
    assert job.returncode == 1, job.stderr[-3000:]
    assert "error: CUDA out of memory at step 6" in job.stderr
    assert "after 5 steps that fitted: likely transient" in job.stderr
    assert [record["step"] for record in job.metrics] == [1, 2, 3, 4, 5]
