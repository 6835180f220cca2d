"""Whether a run can resume from its newest checkpoint with the settings it now has.

DeepSpeed loads a checkpoint as it was saved only into an engine of the same ZeRO stage and
precision: a ZeRO-2 checkpoint holds one optimizer partition per rank, a ZeRO-3 one also
partitions the parameters, and the bf16 and fp16 optimizers keep different state. Asked
otherwise, its load fails deep inside every rank with an empty reason. A changed
data-parallel world size, tensor or sequence degree, or ZeRO stage is fine: the
checkpointer loads through a universal checkpoint (deepspeed/checkpoint/ds_to_universal.py,
and training/private_apis.py for stage 0) then. Refused: a change of precision, and one
that converts a stage 0 checkpoint whose manifest does not name its parameters (saved
before it did). So the launcher compares the manifest of the checkpoint resume would take
(local, or in S3 on a new node) with the run's config once, before any rank starts; the
ranks compare it again with their engine before loading (the same sentence), should the
launcher not have been able to read it.
"""

from __future__ import annotations

import logging
from pathlib import Path

from training.checkpoint.layout import (
    PARAMETER_GROUPS_KEY,
    committed_tags,
    parse_step,
    read_manifest,
)
from training.checkpoint.store import CheckpointStore
from training.spec.config import Config, ConfigError, PrecisionConfig
from training.spec.parallel import tensor_degree

log = logging.getLogger(__name__)


def config_precision(precision: PrecisionConfig) -> str:
    return "bf16" if precision.bf16 else "fp16" if precision.fp16 else "fp32"


def engine_precision(engine) -> str:
    """The precision a DeepSpeed engine trains in, as the checkpoint manifest records it."""
    return "bf16" if engine.bfloat16_enabled() else "fp16" if engine.fp16_enabled() else "fp32"


def check_resumable(config: Config, mirror: CheckpointStore | None = None) -> None:
    """Raise ConfigError, naming what changed and the ways on, when the newest committed
    checkpoint (under config.checkpoint_dir, or in ``mirror`` when newer there, as resume
    chooses) was saved with another ZeRO stage or precision."""
    newest = _newest_manifest(Path(config.checkpoint_dir), mirror)
    if newest is None:
        return
    where, record = newest
    problem = refusal(
        where,
        record,
        zero_stage=config.zero.stage,
        precision=config_precision(config.precision),
        tensor=tensor_degree(config),
    )
    if problem is not None:
        raise ConfigError(problem)


def refusal(
    where: str, record: dict, *, zero_stage: int, precision: str, tensor: int = 1
) -> str | None:
    """The one line that stops a run (of ``tensor``-way tensor parallelism) whose ZeRO stage
    or precision is not the one the checkpoint at ``where`` (its manifest: ``record``) was
    saved with and cannot load; None when it can."""
    changed = []
    saved_stage, saved_tensor = record.get("zero_stage", zero_stage), record.get("tensor", 1)
    if not _converts(record, zero_stage, tensor):
        if saved_stage != zero_stage:
            changed.append(("zero.stage", saved_stage, zero_stage))
        if saved_tensor != tensor:
            changed.append(("parallel.tensor", saved_tensor, tensor))
    saved = record.get("precision", precision)  # manifests before this field: not known
    if saved != precision:
        changed.append(("precision", saved, precision))
    if not changed:
        return None
    what = ", ".join(f"{key} {old} (this run: {new})" for key, old, new in changed)
    back = " ".join(_setting(key, old) for key, old, _ in changed)
    return (
        f"{where} was saved with {what}, which DeepSpeed cannot load into this run: resume "
        f"it with {back}, start over with --fresh (the old run is kept aside), or give the "
        "new setup its own run.name (a run folder of its own)"
    )


def _converts(record: dict, zero_stage: int, tensor: int) -> bool:
    """Whether a checkpoint (its manifest: ``record``) loads at ZeRO stage ``zero_stage`` and
    tensor degree ``tensor``, converted where they changed: always, but from a stage 0
    checkpoint whose manifest does not name its parameters (older ones did not)."""
    saved_stage, saved_tensor = record.get("zero_stage", zero_stage), record.get("tensor", 1)
    if saved_stage == zero_stage and saved_tensor == tensor:
        return True  # what converts then (world size, sequence degree) always does
    return saved_stage != 0 or PARAMETER_GROUPS_KEY in record


def _newest_manifest(root: Path, mirror: CheckpointStore | None) -> tuple[str, dict] | None:
    """(where, manifest) of the checkpoint resume would take: the newest committed here or
    in the mirror. The mirror out of reach leaves the local ones (resume then fails on
    its own, saying so)."""
    local = committed_tags(root) if root.is_dir() else []
    remote = []
    if mirror is not None:
        try:
            remote = mirror.committed_tags()
        except Exception as exc:
            log.warning(
                "cannot list the checkpoints in %s (%s): compared with %s only",
                mirror.uri,
                exc,
                root,
            )
    newest = max([*local, *remote], key=parse_step, default=None)
    if newest is None:
        return None
    if newest in local:
        return str(root / newest), read_manifest(root / newest)
    try:
        return f"{mirror.uri}/{newest}", mirror.manifest(newest)
    except Exception as exc:
        log.warning("cannot read %s/%s's manifest (%s): not compared", mirror.uri, newest, exc)
        return None


def _setting(key: str, value) -> str:
    if key == "precision":
        flags = {"bf16": value == "bf16", "fp16": value == "fp16"}
        return " ".join(f"--set precision.{name}={str(on).lower()}" for name, on in flags.items())
    return f"--set {key}={value}"
