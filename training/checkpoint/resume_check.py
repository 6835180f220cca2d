"""Whether a run can resume from its newest checkpoint with the settings it now has.

DeepSpeed loads a checkpoint only into an engine of the same ZeRO stage and precision: a
ZeRO-2 checkpoint holds one optimizer partition per rank, a ZeRO-3 one also partitions the
parameters, and the bf16 and fp16 optimizers keep different state. Asked otherwise, its
load fails deep inside every rank with an empty reason. A changed data-parallel world size
is fine: the checkpointer loads through a universal checkpoint
(deepspeed/checkpoint/ds_to_universal.py) then. So the launcher compares the newest local
checkpoint's manifest with the run's config once, before any rank starts.
"""

from __future__ import annotations

from pathlib import Path

from training.checkpoint.layout import committed_tags, read_manifest
from training.spec.config import Config, ConfigError, PrecisionConfig


def config_precision(precision: PrecisionConfig) -> str:
    return "bf16" if precision.bf16 else "fp16" if precision.fp16 else "fp32"


def engine_precision(engine) -> str:
    """The precision a DeepSpeed engine trains in, as the checkpoint manifest records it."""
    return "bf16" if engine.bfloat16_enabled() else "fp16" if engine.fp16_enabled() else "fp32"


def check_resumable(config: Config) -> None:
    """Raise ConfigError, naming what changed and the ways on, when the newest committed
    checkpoint under config.checkpoint_dir was saved with another ZeRO stage or precision."""
    root = Path(config.checkpoint_dir)
    tags = committed_tags(root) if root.is_dir() else []
    if not tags:
        return
    folder = root / tags[-1]
    record = read_manifest(folder)
    changed = []
    if record.get("zero_stage", config.zero.stage) != config.zero.stage:
        changed.append(("zero.stage", record["zero_stage"], config.zero.stage))
    now = config_precision(config.precision)
    saved = record.get("precision", now)  # manifests before this field: not known
    if saved != now:
        changed.append(("precision", saved, now))
    if not changed:
        return
    what = ", ".join(f"{key} {old} (this run: {new})" for key, old, new in changed)
    back = " ".join(_setting(key, old) for key, old, _ in changed)
    raise ConfigError(
        f"{folder} was saved with {what}, which DeepSpeed cannot load into this run: resume "
        f"it with {back}, start over with --fresh (the old run is kept aside), or give the "
        "new setup its own run.name (a run folder of its own)"
    )


def _setting(key: str, value) -> str:
    if key == "precision":
        flags = {"bf16": value == "bf16", "fp16": value == "fp16"}
        return " ".join(f"--set precision.{name}={str(on).lower()}" for name, on in flags.items())
    return f"--set {key}={value}"
