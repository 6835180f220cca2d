"""Real jobs: the launcher with 2 gloo ranks on CPU, read back through metrics.jsonl."""

from __future__ import annotations

import pytest

from tests.training.jobs import NO_DROPOUT, STEPS, TINY, job_env, run_job, shared_run

pytestmark = pytest.mark.multiprocess

# fp32 losses of ZeRO 1-3 match stage 0 to this relative tolerance: the same math,
# only summed in a different order across flattened/partitioned buffers (measured on
# CPU: at most 1.3e-7 over 40 steps).
ZERO_RTOL = 1e-5
# The module's tests share its runs (one worker, tests/support/suite_time.py): whichever
# runs first pays for them.
ZERO_RUNS = pytest.mark.slow(
    reason="the first test of the module to run pays for one 2-rank job per ZeRO stage",
    seconds=150,
)


# Stage 3 also offloads parameters and optimizer to the CPU and recomputes activations:
# that changes where and when things are computed, not the result.
STAGE_OPTIONS = {
    0: ("zero.stage=0",),
    1: ("zero.stage=1",),
    2: ("zero.stage=2",),
    3: (
        "zero.stage=3",
        "zero.offload_optimizer=true",
        "zero.offload_param=true",
        "model.activation_checkpointing=true",
    ),
}


@pytest.fixture(scope="module")
def zero_runs(tmp_path_factory):
    """One job per ZeRO stage, same seed and data."""
    return {
        stage: shared_run(tmp_path_factory, *TINY, *options)
        for stage, options in STAGE_OPTIONS.items()
    }


@ZERO_RUNS
@pytest.mark.parametrize("stage", range(4))
def test_each_zero_stage_trains_and_loss_falls(zero_runs, stage):
    job = zero_runs[stage]
    losses = job.losses
    assert [record["step"] for record in job.metrics] == list(range(1, STEPS + 1))
    assert sum(losses[-5:]) < 0.7 * sum(losses[:5])
    assert (job.output_dir / "checkpoints" / f"step_{STEPS:08d}" / "commit.json").is_file()
    assert f"done: {STEPS} steps" in job.stdout


@ZERO_RUNS
def test_zero_stages_give_the_same_fp32_losses(zero_runs):
    reference = zero_runs[0].losses
    for stage in (1, 2, 3):
        assert zero_runs[stage].losses == pytest.approx(reference, rel=ZERO_RTOL), stage


@ZERO_RUNS
def test_metrics_records_carry_throughput_and_position(zero_runs):
    metrics = zero_runs[2].metrics
    record = metrics[-1]
    assert record["tokens_per_s"] > 0
    # 2 ranks x micro-batch 4 x 32 tokens per step.
    assert record["samples_per_s"] * 32 == pytest.approx(record["tokens_per_s"])
    assert record["tflops_per_gpu"] > 0
    assert record["mfu"] is None  # no GPU, no peak
    assert record["lr"] == pytest.approx(3e-3)
    # 15 steps per epoch of 120 samples: step 16 is the first of epoch 1.
    assert (metrics[14]["epoch"], metrics[14]["samples_seen_in_epoch"]) == (0, 120)
    assert (metrics[15]["epoch"], metrics[15]["samples_seen_in_epoch"]) == (1, 8)


def test_accumulation_equals_one_bigger_batch(tmp_path_factory, tmp_path):
    """2 micro-batches of 2 with accumulation = 1 micro-batch of 4: same samples, same
    mean loss, same gradients, so the same losses step after step (no dropout here, as
    it would draw its masks for differently shaped tensors)."""
    big = shared_run(tmp_path_factory, *NO_DROPOUT)
    accumulated = run_job(tmp_path, *NO_DROPOUT, "train.micro_batch_size=2")
    assert accumulated.returncode == 0, accumulated.stderr[-3000:]
    assert accumulated.metrics[0]["samples_per_s"] > 0
    assert accumulated.losses == pytest.approx(big.losses, rel=1e-5)


def test_demo_job_runs_with_no_arguments(tmp_path):
    """`python -m training` alone: the tiny demo, into runs/demo under the working directory."""
    env = job_env(tmp_path / "unused")
    del env["TRAIN_OUTPUT_DIR"]
    job = run_job(tmp_path / "runs" / "demo", cwd=tmp_path, env=env)
    assert job.returncode == 0, job.stderr[-3000:]
    assert (tmp_path / "runs/demo/checkpoints/step_00000030/commit.json").is_file()
    metrics = job.metrics
    assert metrics[-1]["step"] == 30
    assert metrics[-1]["loss"] < 0.7 * metrics[0]["loss"]
    assert list((tmp_path / "runs/demo/tensorboard").glob("events.out.tfevents.*"))
    assert any(line.startswith("done: 30 steps") for line in job.stdout.splitlines())


def test_bert_style_encoder_trains_on_masked_tokens(tmp_path):
    job = run_job(
        tmp_path,
        *TINY,
        "model.preset=bert-tiny",
        "model.dropout=0",
        "data.vocab_size=32",
        "data.mask_prob=0.3",
        "train.steps=100",
        "logging.every_steps=20",
    )
    assert job.returncode == 0, job.stderr[-3000:]
    losses = job.losses
    assert losses[0] == pytest.approx(3.47, abs=0.3)  # ln 32: guessing among 32 tokens
    assert losses[-1] < 0.85 * losses[0]
