"""A tiny-Llama job run on one layout or another ([parallel] tensor or sequence), for the
stories that compare layouts and resume a checkpoint on another."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from tests.training.jobs import Job, job_env, run_job


def write_job(folder: Path, tiny_hf, *, steps: int, checkpoint_every: int) -> Path:
    """A ZeRO-1 job of a fixed global batch, with no gradient clipping, a metrics record
    every step and a checkpoint every `checkpoint_every` steps."""
    job = folder / "job.toml"
    job.write_text(
        f"""
[run]
seed = 1234
[model]
hf = "{tiny_hf.model}"
[data]
kind = "jsonl"
path = "{tiny_hf.corpus}"
seq_len = 32
[train]
steps = {steps}
global_batch_size = 8
gradient_clipping = 0.0
[optimizer]
lr = 3e-3
[scheduler]
kind = "constant"
warmup_steps = 2
[zero]
stage = 1
[checkpoint]
every_steps = {checkpoint_every}
[logging]
every_steps = 1
progress_bar = false
tensorboard = false
"""
    )
    return job


def train(
    out: Path,
    job: Path,
    ranks: int,
    *layout: str,
    resume_from: Path | None = None,
    resume_step: int | None = None,
) -> Job:
    """`job` on `ranks` ranks with the overrides `layout` ("parallel.tensor=2"), from
    `resume_from`'s checkpoint of `resume_step` when given."""
    if resume_from is not None:
        (out / "checkpoints").mkdir(parents=True)
        tag = f"step_{resume_step:08d}"
        shutil.copytree(resume_from / "checkpoints" / tag, out / "checkpoints" / tag)
    env = job_env(out, TRAIN_NPROC_PER_NODE=str(ranks), TRAIN_CACHE_DIR=str(out.parent / "cache"))
    done = run_job(out, *layout, config=job, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def losses(done: Job) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in done.metrics}


def adam_moments(out: Path, step: int) -> list[torch.Tensor]:
    """exp_avg and exp_avg_sq of a 1-rank ZeRO-1 run's checkpoint of `step`, in order."""
    path = out / "checkpoints" / f"step_{step:08d}" / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    saved = torch.load(path, map_location="cpu", weights_only=False)["optimizer_state_dict"]
    state = saved["base_optimizer_state"]["state"]
    return [group[key] for _, group in sorted(state.items()) for key in ("exp_avg", "exp_avg_sq")]


def assert_moments_equal(run: Path, uninterrupted: Path, step: int, rtol: float, atol: float):
    """Two 1-rank ZeRO-1 runs' Adam moments at `step`, tensor by tensor."""
    for mine, theirs in zip(
        adam_moments(run, step), adam_moments(uninterrupted, step), strict=True
    ):
        torch.testing.assert_close(mine, theirs, rtol=rtol, atol=atol)


def assert_same_exported_weights(
    split: Path, whole: Path, rtol: float = 1e-5, atol: float = 1e-6
) -> None:
    """`python -m training export` of both runs' last checkpoints: the same full weights."""
    from transformers import AutoModelForCausalLM

    from training.checkpoint.export import export

    exported = []
    for run in (split, whole):
        if not (run.parent / f"{run.name}-hf").exists():
            export(run / "checkpoints", run.parent / f"{run.name}-hf")
        exported.append(AutoModelForCausalLM.from_pretrained(run.parent / f"{run.name}-hf"))
    weights, expected = (model.state_dict() for model in exported)
    assert weights.keys() == expected.keys()
    for key, weight in expected.items():
        torch.testing.assert_close(weights[key], weight, rtol=rtol, atol=atol)
