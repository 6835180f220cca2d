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

import argparse
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

from training.checkpoint.collectives import Ranks, log_on_rank0
from training.checkpoint.commit import make_durable, remove_step_dir
from training.checkpoint.errors import CheckpointError
from training.checkpoint.layout import (
    CLIENT_STATE_KEY,
    COMMIT_MARKER,
    COMPLETE,
    DAMAGED,
    PARTIAL,
    UNCOMMITTED,
    UNIVERSAL_DIR,
    examine,
    manifest_bytes,
    parse_step,
    read_manifest,
    step_dirs,
    write_atomically,
)
from training.checkpoint.store import CheckpointStore

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ResumePoint:
    """The committed checkpoint a run resumes from, complete on every writer's root."""

    tag: str
    step: int
    load_root: Path  # the checkpoint root, or its universal/ folder
    # Saved by another number of data-parallel ranks: loaded through a universal checkpoint,
    # into an engine built with DeepSpeed's checkpoint.load_universal.
    universal: bool


def choose(
    dp_world_size: int, root: Path, mirror: CheckpointStore | None, ranks: Ranks
) -> ResumePoint | None:
    """The newest loadable committed checkpoint, made complete here (and converted when
    ``dp_world_size`` differs from the saving run's); every rank calls it.

    None when no checkpoint was ever committed.
    """
    verified: set[str] = set()  # tags whose checksums this process checked
    remote = ranks.on_rank0(lambda: _remote_tags(mirror))
    refused: set[str] = set()
    while True:
        inventories = ranks.on_writers(lambda: _inventory(root, refused, verified))
        tag = _choose(inventories, [t for t in remote if t not in refused])
        if tag is None:
            break
        try:
            ranks.on_writers(lambda tag=tag: _make_complete(root, tag, remote, mirror, verified))
        except CheckpointError as error:
            log_on_rank0(
                log,
                logging.WARNING,
                "%s cannot be loaded (%s): resuming from the committed checkpoint before it",
                tag,
                error,
            )
            refused.add(tag)
            continue
        break
    if tag is None:
        damaged = sorted({t for inventory in inventories for t in inventory} | refused)
        if damaged:
            raise CheckpointError(
                f"no checkpoint in {root} can be loaded, though {', '.join(damaged)} "
                "were committed (damaged files, or parts on other nodes and no S3 copy; "
                "see the warnings above): refusing to start from scratch"
            )
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
    if record["zero_stage"] > 0 and record["dp_world_size"] != dp_world_size:
        log_on_rank0(
            log,
            logging.INFO,
            "%s was saved by %d data-parallel ranks, this run has %d: "
            "loading it through a universal checkpoint",
            tag,
            record["dp_world_size"],
            dp_world_size,
        )
        ranks.on_writers(lambda: _convert_to_universal(root, tag))
        load_root = root / UNIVERSAL_DIR
    return ResumePoint(tag, record["step"], load_root, universal=load_root != root)


def _inventory(root: Path, refused: set[str], verified: set[str]) -> dict[str, str]:
    """Writers: state of every committed step folder here (the others are logged).

    Newest first, each folder's checksums are verified until one is complete;
    the older ones are only sized, since resume will not reach them.
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
        if state != COMPLETE:
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
) -> None:
    """Writers: fetch from the mirror whatever this node's copy of ``tag`` lacks."""
    folder = root / tag
    state, reason = (COMPLETE, "verified") if tag in verified else examine(folder, verify=True)
    if state == COMPLETE:
        log.info("loading %s from local disk", folder)
        return
    if tag not in remote:
        raise CheckpointError(f"{folder} cannot be loaded ({reason}) and S3 has no copy")
    log.info("fetching %s from %s (%s here: %s)", tag, mirror.uri, state, reason)
    if state == DAMAGED:
        remove_step_dir(folder)  # a same-size damaged file would otherwise be kept
    mirror.download(tag, root)
    state, reason = examine(folder, verify=True)
    if state != COMPLETE:
        raise CheckpointError(f"{tag} fetched from {mirror.uri} is {state}: {reason}")


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


def _convert_to_universal(root: Path, tag: str) -> None:
    """Writers: DeepSpeed's ds_to_universal of ``tag``, committed with a manifest of its own.

    https://www.deepspeed.ai/tutorials/universal-checkpointing/
    """
    from deepspeed.checkpoint import ds_to_universal

    out = root / UNIVERSAL_DIR / tag
    if examine(out)[0] == COMPLETE:
        return
    shutil.rmtree(out, ignore_errors=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    ds_to_universal.main(
        argparse.Namespace(
            input_folder=str(root / tag),
            output_folder=str(out),
            num_extract_workers=1,
            num_merge_workers=1,
            keep_temp_folder=False,
            strict=True,
            inject_missing_state=False,
        )
    )
    record = read_manifest(root / tag)
    record["files"] = make_durable(out, {})
    write_atomically(out / COMMIT_MARKER, manifest_bytes(record))


def load(engine, point: ResumePoint) -> dict:
    """DeepSpeed's public ``engine.load_checkpoint`` of the chosen tag, named explicitly;
    the saved client_state. The engine must have been built for ``point`` (see above)."""
    if engine.load_universal_checkpoint() != point.universal:
        needed = "with" if point.universal else "without"
        raise CheckpointError(
            f"{point.tag} loads into an engine built {needed} DeepSpeed's "
            "checkpoint.load_universal: choose the checkpoint (Checkpointer.choose_resume) "
            "before building the engine, and build it for that point"
        )
    load_root, tag = point.load_root, point.tag
    try:
        load_path, client_state = engine.load_checkpoint(str(load_root), tag=tag)
    except Exception as exc:
        raise CheckpointError(f"DeepSpeed could not load {load_root / tag}: {exc}") from exc
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
