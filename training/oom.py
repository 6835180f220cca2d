"""A CUDA out-of-memory error as one sentence naming what the config can change.

An OOM within the first steps of a run is the configuration: the same model, batch and
ZeRO stage need the same memory every step, so running it again fails again (exit 2).
Later, the steady state has fitted for a while and the failure is more likely a transient
(fragmentation, an unusually long batch, another process on the GPU): exit 1, and the
job resumes from its last checkpoint when restarted.
"""

from __future__ import annotations

from training.contract import ExitCode
from training.spec.config import BatchSizes, Config
from training.spec.presets import VISION_PRESETS

# Optimizer steps after the start (or resume) within which an OOM counts as the config.
CONFIG_STEPS = 3


class OutOfMemory(Exception):
    """str(error) is the one-line message; exit_code BAD_CONFIG (config) or FAILED."""

    def __init__(self, message: str, exit_code: ExitCode):
        super().__init__(message)
        self.exit_code = exit_code


def remedies(config: Config, batch: BatchSizes) -> list[str]:
    """What the config can still change to need less GPU memory, cheapest first."""
    zero, model = config.zero, config.model
    found = []
    if batch.micro_batch_size > 1:
        found.append(
            f"lower train.micro_batch_size (now {batch.micro_batch_size}) and keep "
            f"train.global_batch_size = {batch.global_batch_size} so the accumulation grows"
        )
    vision = model.builder is None and model.preset in VISION_PRESETS
    if not vision and not model.activation_checkpointing:
        found.append("set model.activation_checkpointing = true")
    top = 2 if vision else 3  # the image models do not run at ZeRO-3 (spec/config.py)
    if zero.stage < top:
        higher = str(top) if zero.stage == top - 1 else f"{zero.stage + 1} or {top}"
        found.append(f"raise zero.stage (now {zero.stage}) to {higher}")
    if zero.stage > 0 and not zero.offload_optimizer:
        found.append("set zero.offload_optimizer = true")
    if zero.stage == 3 and not zero.offload_param:
        found.append("set zero.offload_param = true")
    return found


def explain(config: Config, batch: BatchSizes, *, step: int, first_step: int) -> OutOfMemory:
    """The error to end the run with, for an OOM while making optimizer step `step` + 1."""
    options = remedies(config, batch)
    advice = "; or ".join(options) if options else "use GPUs with more memory or a smaller model"
    where = (
        f"CUDA out of memory at step {step + 1} (micro batch {batch.micro_batch_size}, "
        f"ZeRO stage {config.zero.stage})"
    )
    if step - first_step < CONFIG_STEPS:
        return OutOfMemory(
            f"{where}: this configuration does not fit; {advice}", ExitCode.BAD_CONFIG
        )
    return OutOfMemory(
        f"{where}, after {step - first_step} steps that fitted: likely transient, run again to "
        f"resume from the last checkpoint; if it recurs, {advice}",
        ExitCode.FAILED,
    )
