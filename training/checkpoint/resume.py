"""Resuming: find the newest committed checkpoint, local or in the mirror, and load it.

DeepSpeed's own ``latest`` file is never read: a missing one makes ``load_checkpoint``
start from scratch without an error. Each writer takes stock of its root, verifying
checksums newest first; a step complete on every node, or committed in the mirror, is
chosen, and whatever a node lacks of it is fetched. When the data-parallel size changed,
a ZeRO checkpoint is converted to a universal one first (``universal/step_NNNNNNNN/``).

Choosing comes before the engine is built: whether DeepSpeed loads a universal checkpoint
is its config's ``checkpoint.load_universal``
(https://www.deepspeed.ai/tutorials/universal-checkpointing/), read when the engine is
built (``DeepSpeedConfig``, deepspeed/runtime/config.py, DeepSpeed 0.19.8) and never
changed after, so the trainer builds its engine for the point chosen here.
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

from training.checkpoint.collectives import Ranks, log_on_rank0
from training.checkpoint.commit import make_durable
from training.checkpoint.damaged import set_aside, set_aside_folders
from training.checkpoint.errors import CheckpointError
from training.checkpoint.layout import (
    CLIENT_STATE_KEY,
    COMMIT_MARKER,
    COMPLETE,
    DAMAGED,
    DAMAGED_DIR,
    PARAMETER_GROUPS_KEY,
    PARTIAL,
    UNCOMMITTED,
    UNIVERSAL_DIR,
    examine,
    manifest_bytes,
    manifest_checksum,
    parse_step,
    read_manifest,
    step_dirs,
    write_atomically,
)
from training.checkpoint.store import CheckpointStore

log = logging.getLogger(__name__)

# What happens instead of loading a damaged folder.
_RESUME_ELSEWHERE = (
    "resuming from the S3 copy or an older checkpoint; this step is written again when "
    "training reaches it"
)
_OLDER = "resuming from the committed checkpoint before it"
# A universal conversion's manifest names the checkpoint it was made from (its manifest's
# checksum): a step saved again is converted again.
_CONVERTED_FROM = "converted_from"


@dataclass(frozen=True)
class ResumePoint:
    """The committed checkpoint a run resumes from, complete on every writer's root."""

    tag: str
    step: int
    load_root: Path  # the checkpoint root, or its universal/ folder
    # Saved by another number of data-parallel ranks, another tensor or sequence degree or
    # at another ZeRO stage: loaded through a universal checkpoint (load_root: universal/),
    universal: bool
    # into an engine built with DeepSpeed's checkpoint.load_universal, unless that engine is
    # at ZeRO stage 0, which DeepSpeed's universal loaders do not load (the trainer does).
    deepspeed_loads_universal: bool
    # Its commit manifest: what it was saved with (training.checkpoint.resume_check says
    # which changes load).
    manifest: dict


def choose(
    dp_world_size: int,
    root: Path,
    mirror: CheckpointStore | None,
    ranks: Ranks,
    tensor: int = 1,
    zero_stage: int | None = None,
    sequence: int = 1,
) -> ResumePoint | None:
    """The newest loadable committed checkpoint, made complete here (and converted when
    ``dp_world_size``, the ``tensor`` or ``sequence`` degree or the ZeRO stage,
    ``zero_stage``, differs from the saving run's); every rank calls it.

    None when no checkpoint was ever committed.
    """
    verified: set[str] = set()  # tags whose checksums this process checked
    remote = ranks.on_rank0(lambda: _remote_tags(mirror))
    refused: set[str] = set()
    committed: set[str] = set()  # every tag seen committed here (damaged ones included)
    while True:
        inventories = ranks.on_writers(lambda: _inventory(root, refused, verified))
        committed.update(*inventories)
        tag = _choose(inventories, [t for t in remote if t not in refused])
        if tag is None:
            break
        if all(
            ranks.on_writers(lambda tag=tag: _make_complete(root, tag, remote, mirror, verified))
        ):
            break
        refused.add(tag)
    if tag is None:
        set_aside_before = any(ranks.on_writers(lambda: set_aside_folders(root)))
        if committed or refused or set_aside_before:
            raise _nothing_loadable(root, sorted(committed | refused, key=parse_step))
        where = f" or {mirror.uri}" if mirror is not None else ""
        log_on_rank0(
            log, logging.INFO, "no committed checkpoint in %s%s: starting fresh", root, where
        )
        return None
    log_on_rank0(
        log,
        logging.INFO,
        "newest checkpoint: %s (in %s: %s, in S3: %s)",
        tag,
        root,
        _newest(t for inventory in inventories for t, s in inventory.items() if s == COMPLETE),
        _newest(remote) if mirror is not None else "no mirror",
    )
    record = read_manifest(root / tag)

    load_root = root
    # Manifests before a field had no such groups.
    saved = (record.get("tensor", 1), record.get("sequence", 1), record["dp_world_size"])
    wanted = (tensor, sequence, dp_world_size)
    # ZeRO partitions over the sequence x data ranks of each tensor slice; stage 0 keeps
    # whole copies, which load on any number of them.
    new_partitions = record["zero_stage"] > 0 and saved[1:] != wanted[1:]
    # Among ZeRO stages through the same conversion (DeepSpeed 0.19.8: ds_to_universal reads
    # stages 1, 2 and 3, stage_1_and_2.py's and stage3.py's _load_universal_checkpoint load
    # into any; stage 0 converts and loads in training/private_apis.py); resume_check refuses
    # the changes that cannot convert before here.
    stage = record["zero_stage"] if zero_stage is None else zero_stage
    if new_partitions or saved[0] != tensor or stage != record["zero_stage"]:
        log_on_rank0(
            log,
            logging.INFO,
            "%s was saved by tensor %d x sequence %d x data %d at ZeRO stage %d, this run is "
            "tensor %d x sequence %d x data %d at ZeRO stage %d: converted to a universal "
            "checkpoint (weights and Adam moments) and loaded",
            tag,
            *saved,
            record["zero_stage"],
            *wanted,
            stage,
        )
        ranks.on_writers(lambda: convert_to_universal(root, tag))
        load_root = root / UNIVERSAL_DIR
    universal = load_root != root
    return ResumePoint(
        tag,
        record["step"],
        load_root,
        universal=universal,
        deepspeed_loads_universal=universal and stage != 0,
        manifest=record,
    )


def _weights_loaded_after(src, dst) -> None:
    """DeepSpeed's hook for loading the module state (load_checkpoint's custom_load_fn):
    nothing, the weights come from the universal folder."""


def _undo_universal_load_sharing(engine, decays: list[float]) -> None:
    """A ZeRO-3 engine loading a universal checkpoint (DeepSpeed 0.19.8, zero/stage3.py
    load_hp_checkpoint_state_from_checkpoint_dir_stage3) gives every parameter group the
    first group's settings, and every group's Adam state one and the same step tensor, which
    Adam then advances once per group and step (measured: losses 5e-3 off the uninterrupted
    run's 6 steps later). Each group gets back the job's weight decay (the norms and biases
    would otherwise decay like the matrices) and a step of its own. tests/training/
    test_private_apis.py checks DeepSpeed still does both."""
    import torch

    for group, decay in zip(engine.optimizer.param_groups, decays, strict=True):
        group["weight_decay"] = decay
    for state in engine.optimizer.optimizer.state.values():
        if isinstance(state.get("step"), torch.Tensor):
            state["step"] = state["step"].clone()


def _nothing_loadable(root: Path, committed: list[str]) -> CheckpointError:
    """Checkpoints were committed (or set aside as damaged) and none loads: training from
    scratch over them would lose the run."""
    what = f"{', '.join(committed)} were committed" if committed else "checkpoints were committed"
    return CheckpointError(
        f"no checkpoint in {root} can be loaded, though {what} (damaged files, set aside in "
        f"{root / DAMAGED_DIR}, or parts on other nodes and no S3 copy; see the warnings "
        "above): refusing to start from scratch"
    )


def _inventory(root: Path, refused: set[str], verified: set[str]) -> dict[str, str]:
    """Writers: state of every committed step folder here (the others are logged).

    Newest first, each folder's checksums are verified until one is complete;
    the older ones are only sized, since resume will not reach them. A damaged folder
    is set aside (training.checkpoint.damaged) and listed as DAMAGED.
    """
    inventory = {}
    verifying = True
    for tag in reversed(step_dirs(root)):
        if tag in refused:
            continue
        state, reason = examine(root / tag, verify=verifying)
        if state == COMPLETE and verifying:
            verified.add(tag)
            verifying = False
        if state == DAMAGED:
            set_aside(root / tag, root, reason, then=_RESUME_ELSEWHERE)
        elif state != COMPLETE:
            level = logging.INFO if state == PARTIAL else logging.WARNING
            log.log(level, "%s is %s: %s", root / tag, state, reason)
        if state != UNCOMMITTED:
            inventory[tag] = state
    return dict(reversed(inventory.items()))


def _remote_tags(mirror: CheckpointStore | None) -> list[str]:
    if mirror is None:
        return []
    try:
        return mirror.committed_tags()
    except Exception as exc:
        raise CheckpointError(f"cannot list the checkpoints in {mirror.uri}: {exc}") from exc


def _make_complete(
    root: Path, tag: str, remote: list[str], mirror: CheckpointStore | None, verified: set[str]
) -> bool:
    """Writers: fetch from the mirror whatever this node's copy of ``tag`` lacks; False,
    having said why, when it cannot be made complete and verified."""
    folder = root / tag
    state, reason = (COMPLETE, "verified") if tag in verified else examine(folder, verify=True)
    if state == COMPLETE:
        log.info("loading %s from local disk", folder)
        return True
    if tag not in remote:
        if state == DAMAGED:
            set_aside(folder, root, reason, then=_RESUME_ELSEWHERE)
        else:
            log.warning("%s cannot be loaded (%s) and S3 has no copy: %s", folder, reason, _OLDER)
        return False
    log.info("fetching %s from %s (%s here: %s)", tag, mirror.uri, state, reason)
    if state == DAMAGED:  # replaced whole: a same-size damaged file would otherwise be kept
        set_aside(folder, root, reason, then=f"fetching {tag} from {mirror.uri}")
    mirror.download(tag, root)
    state, reason = examine(folder, verify=True)
    if state == COMPLETE:
        return True
    if state == DAMAGED:
        set_aside(folder, root, f"as fetched from {mirror.uri}, {reason}", then=_OLDER)
    else:
        log.warning(
            "%s cannot be loaded (as fetched from %s it is %s: %s): %s",
            tag,
            mirror.uri,
            state,
            reason,
            _OLDER,
        )
    return False


def _choose(inventories: list[dict[str, str]], remote: list[str]) -> str | None:
    """The newest tag complete on every writer or committed in the mirror."""
    candidates = set(remote).union(*inventories)
    for tag in sorted(candidates, key=parse_step, reverse=True):
        complete_here = all(inventory.get(tag) == COMPLETE for inventory in inventories)
        if complete_here or tag in remote:
            return tag
    return None


def _newest(tags) -> str:
    tags = sorted(tags, key=parse_step)
    return tags[-1] if tags else "none"


def convert_to_universal(root: Path, tag: str) -> None:
    """Writers: DeepSpeed's ds_to_universal of ``tag``, committed with a manifest of its own.

    An earlier conversion is reused only when it was made from this very checkpoint (its
    manifest names the source's) and its checksums verify; a damaged one is set aside.
    https://www.deepspeed.ai/tutorials/universal-checkpointing/
    """
    from training.private_apis import convert_to_universal, universal_from_stage_0

    out = root / UNIVERSAL_DIR / tag
    record = read_manifest(root / tag)
    source = manifest_checksum(record)
    if out.exists():
        state, reason = examine(out, verify=True)
        if state == COMPLETE and read_manifest(out).get(_CONVERTED_FROM) == source:
            log.info("loading %s, converted before", out)
            return
        if state == DAMAGED:
            set_aside(out, root, reason, then=f"converting {tag} again")
        else:  # unfinished, or converted from an earlier checkpoint of the same step
            shutil.rmtree(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if record["zero_stage"] == 0:
        out.mkdir()
        universal_from_stage_0(root / tag, out, record[PARAMETER_GROUPS_KEY])
    else:
        convert_to_universal(root / tag, out)
    record["files"] = make_durable(out, {})
    record[_CONVERTED_FROM] = source
    write_atomically(out / COMMIT_MARKER, manifest_bytes(record))


def load(engine, point: ResumePoint) -> dict:
    """DeepSpeed's public ``engine.load_checkpoint`` of the chosen tag, named explicitly;
    the saved client_state. The engine must have been built for ``point`` (see above)."""
    if engine.load_universal_checkpoint() != point.deepspeed_loads_universal:
        needed = "with" if point.deepspeed_loads_universal else "without"
        raise CheckpointError(
            f"{point.tag} loads into an engine built {needed} DeepSpeed's "
            "checkpoint.load_universal: choose the checkpoint (Checkpointer.choose_resume) "
            "before building the engine, and build it for that point"
        )
    from training.private_apis import load_universal_into_stage_0

    load_root, tag = point.load_root, point.tag
    decays = [group["weight_decay"] for group in engine.optimizer.param_groups]
    # DeepSpeed loads a universal checkpoint's weights and optimizer state into ZeRO's
    # partitions only: into stage 0 they are loaded here, and DeepSpeed's load brings the
    # rest (its module state, the saving run's, is left: custom_load_fn).
    by_hand = point.universal and not point.deepspeed_loads_universal
    try:
        load_path, client_state = engine.load_checkpoint(
            str(load_root),
            tag=tag,
            load_optimizer_states=not by_hand,
            custom_load_fn=_weights_loaded_after if by_hand else None,
        )
        if by_hand:
            load_universal_into_stage_0(engine, load_root / tag)
    except Exception as exc:
        raise CheckpointError(f"DeepSpeed could not load {load_root / tag}: {exc}") from exc
    if point.deepspeed_loads_universal:
        _undo_universal_load_sharing(engine, decays)
    if load_path is None:
        raise CheckpointError(
            f"DeepSpeed loaded nothing from committed checkpoint {load_root / tag}"
        )
    if CLIENT_STATE_KEY not in client_state:
        raise CheckpointError(
            f"{load_root / tag} was not written by training.checkpoint.checkpointer"
        )
    log_on_rank0(log, logging.INFO, "resumed from %s at step %d", load_root / tag, point.step)
    return client_state[CLIENT_STATE_KEY]
