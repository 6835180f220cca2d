"""Crash-safe DeepSpeed checkpoints: commit marker, keep-last pruning, S3 mirror, resume.

Layout under the checkpoint root (``TRAIN_CHECKPOINT_DIR``):

    step_00000100/            DeepSpeed's files for step 100
    step_00000100/commit.json written last: lists every file of the checkpoint and its size
    latest_committed          names the newest committed step (for people and tools)
    universal/step_00000100/  converted copy, made when the data-parallel size changes

DeepSpeed's own ``latest`` file is never written or read: it is not written
atomically, and a missing one makes ``load_checkpoint`` start from scratch
without an error. A step folder is loadable only when its marker parses and
every file it lists is present with the recorded size.

The root may be shared by all nodes (one filesystem) or local to each node.
Rank 0 does the file work on a shared root; on node-local roots each node's
first rank does it for its node. A node-local folder then holds only that
node's part of the checkpoint (its marker still lists every file), and the
S3 mirror is what joins the parts: on resume each node fetches what it lacks.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shutil
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import torch.distributed as dist

if TYPE_CHECKING:
    from training.checkpoint.s3 import S3Mirror

log = logging.getLogger(__name__)

COMMIT_MARKER = "commit.json"
# DeepSpeed copies these beside every ZeRO save; they import huggingface_hub, which the
# trainer does not install, so they cannot run: `python -m training export` converts.
DEEPSPEED_RECOVERY_SCRIPTS = ("zero_to_fp32.py", "zero_to_torch.py")
POINTER_NAME = "latest_committed"
UNIVERSAL_DIR = "universal"
_TAG_RE = re.compile(r"^step_(\d{8,})$")
# ds_to_universal refuses checkpoints that lack this client_state entry.
_UNIVERSAL_INFO = {"universal_checkpoint_info": {"universal_checkpoint_version": 0.2}}
# The caller's client_state sits under one key, apart from DeepSpeed's own entries.
_CLIENT_STATE_KEY = "training_client_state"

# What a step folder holds, as seen by the node looking at it.
COMPLETE = "complete"  # marker and every listed file: loadable
PARTIAL = "partial"  # marker, some files absent (another node's part): needs S3
DAMAGED = "damaged"  # marker, but a file has the wrong size or the marker is unreadable
UNCOMMITTED = "uncommitted"  # no marker: the save never finished

T = TypeVar("T")


class CheckpointError(RuntimeError):
    """A checkpoint exists but cannot be written, committed or loaded."""


def tag_for(step: int) -> str:
    return f"step_{step:08d}"


def parse_step(tag: str) -> int | None:
    """The step of a ``step_NNNNNNNN`` tag, or None for any other name."""
    match = _TAG_RE.match(tag)
    return int(match.group(1)) if match else None


def examine(folder: Path) -> tuple[str, str]:
    """(state, reason) of a step folder: COMPLETE, PARTIAL, DAMAGED or UNCOMMITTED."""
    try:
        record = json.loads((folder / COMMIT_MARKER).read_text())
        files = dict(record["files"])
    except FileNotFoundError:
        return UNCOMMITTED, f"no {COMMIT_MARKER} (the save did not finish)"
    except (ValueError, KeyError, TypeError) as exc:
        return DAMAGED, f"unreadable {COMMIT_MARKER}: {exc}"
    missing = []
    for name, size in files.items():
        path = folder / name
        if not path.is_file():
            missing.append(name)
        elif path.stat().st_size != size:
            return DAMAGED, f"{name} has {path.stat().st_size} bytes, {size} were saved"
    if missing:
        return PARTIAL, f"{len(missing)} of {len(files)} files are not here ({missing[0]}, ...)"
    return COMPLETE, "every file present"


def committed_tags(root: Path) -> list[str]:
    """Tags of the loadable (complete) step folders under ``root``, oldest first."""
    return [tag for tag in _step_dirs(root) if examine(root / tag)[0] == COMPLETE]


class Checkpointer:
    def __init__(self, root: Path, *, keep_last: int = 3, mirror: S3Mirror | None = None):
        if keep_last < 1:
            raise ValueError(f"keep_last={keep_last!r} must be at least 1 (the newest checkpoint)")
        self.root = Path(root)
        self.keep_last = keep_last
        self.mirror = mirror
        self._shared_root: bool | None = None  # found out on first use, by every rank at once

    # ----------------------------------------------------------------- save

    def save(self, engine, step: int, client_state: dict) -> Path:
        """Write, commit, mirror and prune the checkpoint of ``step``. Every rank calls it."""
        tag = tag_for(step)
        step_dir = self.root / tag
        if all(self._on_writers(lambda: examine(step_dir)[0] in (COMPLETE, PARTIAL))):
            _log_rank0(logging.INFO, "%s is already committed; not writing it again", tag)
            return step_dir
        # Committed on some nodes only (one was replaced): those copies go too, so that
        # no committed folder is rewritten in place.
        self._on_writers(lambda: self._clear_save_dir(step_dir))

        saved_state = {_CLIENT_STATE_KEY: client_state, **_UNIVERSAL_INFO}
        engine.save_checkpoint(str(self.root), tag=tag, client_state=saved_state, save_latest=False)
        self._on_writers(self._drop_recovery_scripts)
        _barrier()  # every rank's files are written before any is listed
        files = _merge_listings(self._on_writers(lambda: _make_durable(step_dir)))
        record = {
            "tag": tag,
            "step": step,
            "dp_world_size": engine.dp_world_size,
            "zero_stage": engine.zero_optimization_stage(),
            "saved_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "files": files,
        }
        self._on_writers(lambda: self._commit(step_dir, record))
        if self.mirror is not None:
            self._mirror(step_dir, tag)
        self._on_writers(self._prune_local)
        if self.mirror is not None:
            _on_rank0(self._prune_mirror)
        return step_dir

    def _clear_save_dir(self, step_dir: Path) -> None:
        if step_dir.exists():
            log.warning("removing %s, left by an earlier run", step_dir)
            _remove_step_dir(step_dir)
        self.root.mkdir(parents=True, exist_ok=True)

    def _commit(self, step_dir: Path, record: dict) -> None:
        write_atomically(step_dir / COMMIT_MARKER, json.dumps(record, indent=1).encode())
        write_atomically(self.root / POINTER_NAME, (record["tag"] + "\n").encode())
        log.info("committed checkpoint %s (%d files)", step_dir, len(record["files"]))

    def _mirror(self, step_dir: Path, tag: str) -> None:
        """Every writer uploads its files; rank 0 commits in S3 only if all of them succeeded.

        A failed upload is logged and does not end the run: the local commit
        stands, and the next save uploads again.
        """

        def upload_part() -> bool:
            try:
                self.mirror.upload_files(step_dir, tag)
            except Exception:
                log.exception("could not mirror %s to %s", step_dir, self.mirror.uri)
                return False
            return True

        def commit_in_s3() -> None:
            try:
                self.mirror.commit(step_dir, tag)
            except Exception:
                log.exception("could not mirror %s to %s", step_dir, self.mirror.uri)

        if all(self._on_writers(upload_part)):
            _on_rank0(commit_in_s3)

    def _prune_local(self) -> None:
        states = {tag: examine(self.root / tag)[0] for tag in _step_dirs(self.root)}
        kept = [tag for tag, state in states.items() if state in (COMPLETE, PARTIAL)]
        keep = set(kept[-self.keep_last :])
        for tag in states:
            if tag not in keep:
                log.info("pruning checkpoint %s (%s)", self.root / tag, states[tag])
                _remove_step_dir(self.root / tag)
        universal = self.root / UNIVERSAL_DIR
        if universal.is_dir():
            for converted in universal.iterdir():
                if converted.is_dir() and converted.name not in keep:
                    shutil.rmtree(converted, ignore_errors=True)

    def _prune_mirror(self) -> None:
        try:
            keep = set(self.mirror.committed_tags()[-self.keep_last :])
            for tag in self.mirror.tags():
                if tag not in keep:
                    log.info("pruning checkpoint %s/%s", self.mirror.uri, tag)
                    self.mirror.delete(tag)
        except Exception:
            log.exception("could not prune old checkpoints in %s", self.mirror.uri)

    # --------------------------------------------------------------- resume

    def resume(self, engine) -> dict | None:
        """Load the newest committed checkpoint, local or S3, into ``engine``.

        Every rank calls it, on a freshly built engine. Returns the saved
        client_state, or None when no checkpoint was ever committed.
        """
        inventories = self._on_writers(self._inventory)
        remote = _on_rank0(self._remote_tags)
        tag = _choose(inventories, remote)
        if tag is None:
            damaged = sorted({t for inventory in inventories for t in inventory})
            if damaged:
                raise CheckpointError(
                    f"no checkpoint in {self.root} can be loaded, though {', '.join(damaged)} "
                    "were committed (damaged files, or parts on other nodes and no S3 copy; "
                    "see the warnings above): refusing to start from scratch"
                )
            where = f" or {self.mirror.uri}" if self.mirror is not None else ""
            _log_rank0(
                logging.INFO, "no committed checkpoint in %s%s: starting fresh", self.root, where
            )
            return None
        _log_rank0(
            logging.INFO,
            "newest checkpoint: %s (in %s: %s, in S3: %s)",
            tag,
            self.root,
            _newest(t for inventory in inventories for t, s in inventory.items() if s == COMPLETE),
            _newest(remote) if self.mirror is not None else "no mirror",
        )
        self._on_writers(lambda: self._make_complete(tag, remote))
        record = json.loads((self.root / tag / COMMIT_MARKER).read_text())

        load_root = self.root
        if record["zero_stage"] > 0 and record["dp_world_size"] != engine.dp_world_size:
            _log_rank0(
                logging.INFO,
                "%s was saved by %d data-parallel ranks, this run has %d: "
                "loading it through a universal checkpoint",
                tag,
                record["dp_world_size"],
                engine.dp_world_size,
            )
            self._on_writers(lambda: self._convert_to_universal(tag))
            load_root = self.root / UNIVERSAL_DIR
        loaded = _load(engine, load_root, tag, universal=load_root != self.root)
        _log_rank0(logging.INFO, "resumed from %s at step %d", load_root / tag, record["step"])
        return loaded[_CLIENT_STATE_KEY]

    def _inventory(self) -> dict[str, str]:
        """Writers: state of every committed step folder here (uncommitted ones are logged)."""
        inventory = {}
        for tag in _step_dirs(self.root):
            state, reason = examine(self.root / tag)
            if state != COMPLETE:
                level = logging.INFO if state == PARTIAL else logging.WARNING
                log.log(level, "%s is %s: %s", self.root / tag, state, reason)
            if state != UNCOMMITTED:
                inventory[tag] = state
        return inventory

    def _remote_tags(self) -> list[str]:
        if self.mirror is None:
            return []
        try:
            return self.mirror.committed_tags()
        except Exception as exc:
            raise CheckpointError(
                f"cannot list the checkpoints in {self.mirror.uri}: {exc}"
            ) from exc

    def _make_complete(self, tag: str, remote: list[str]) -> None:
        """Writers: fetch from S3 whatever this node's copy of ``tag`` lacks."""
        folder = self.root / tag
        state, reason = examine(folder)
        if state == COMPLETE:
            log.info("loading %s from local disk", folder)
            return
        if tag not in remote:
            raise CheckpointError(f"{folder} cannot be loaded ({reason}) and S3 has no copy")
        log.info("fetching %s from %s (%s here: %s)", tag, self.mirror.uri, state, reason)
        self.mirror.download(tag, self.root)
        state, reason = examine(folder)
        if state != COMPLETE:
            raise CheckpointError(f"{tag} fetched from {self.mirror.uri} is {state}: {reason}")

    def _convert_to_universal(self, tag: str) -> None:
        from deepspeed.checkpoint import ds_to_universal

        out = self.root / UNIVERSAL_DIR / tag
        if examine(out)[0] == COMPLETE:
            return
        shutil.rmtree(out, ignore_errors=True)
        out.parent.mkdir(parents=True, exist_ok=True)
        ds_to_universal.main(
            argparse.Namespace(
                input_folder=str(self.root / tag),
                output_folder=str(out),
                num_extract_workers=1,
                num_merge_workers=1,
                keep_temp_folder=False,
                strict=True,
                inject_missing_state=False,
            )
        )
        record = json.loads((self.root / tag / COMMIT_MARKER).read_text())
        record["files"] = _make_durable(out)
        write_atomically(out / COMMIT_MARKER, json.dumps(record, indent=1).encode())

    # ------------------------------------------------------ who does file work

    def _drop_recovery_scripts(self) -> None:
        for name in DEEPSPEED_RECOVERY_SCRIPTS:
            (self.root / name).unlink(missing_ok=True)

    def _on_writers(self, work: Callable[[], T]) -> list[T]:
        """Run ``work`` on the ranks that touch files; every rank gets all their results."""
        return _collective(work, runs_here=self._is_writer())

    def _is_writer(self) -> bool:
        if self._shared_root is None:
            self._shared_root = self._probe_shared_root()
        if self._shared_root:
            return _rank() == 0
        return int(os.environ.get("LOCAL_RANK", "0")) == 0

    def _probe_shared_root(self) -> bool:
        """Whether every rank sees the same root: rank 0 leaves a file there, all look."""
        if not _distributed() or dist.get_world_size() == 1:
            return True

        def leave_probe() -> str:
            self.root.mkdir(parents=True, exist_ok=True)
            probe = self.root / f".probe-{uuid.uuid4().hex}"
            probe.touch()
            return probe.name

        # Each rank looks in its own root: the same path may name another disk there.
        probe = _on_rank0(leave_probe)
        shared = all(_collective((self.root / probe).exists, runs_here=True))
        _on_rank0((self.root / probe).unlink)
        if shared:
            _log_rank0(logging.INFO, "checkpoint root %s is shared by every rank", self.root)
        else:
            _log_rank0(
                logging.WARNING if self.mirror is None else logging.INFO,
                "checkpoint root %s is local to each node: each node keeps its part%s",
                self.root,
                ", joined through S3 on resume"
                if self.mirror is not None
                else "; without TRAIN_S3_URI no node can resume from the others' parts",
            )
        return shared


def _choose(inventories: list[dict[str, str]], remote: list[str]) -> str | None:
    """The newest tag complete on every writer or committed in S3."""
    candidates = set(remote).union(*inventories)
    for tag in sorted(candidates, key=parse_step, reverse=True):
        complete_here = all(inventory.get(tag) == COMPLETE for inventory in inventories)
        if complete_here or tag in remote:
            return tag
    return None


def _newest(tags) -> str:
    tags = sorted(tags, key=parse_step)
    return tags[-1] if tags else "none"


def _load(engine, load_root: Path, tag: str, *, universal: bool) -> dict:
    # load_universal is read from the engine config at load time only, so it
    # can be switched on for this one load.
    config = engine._config
    previous = config.load_universal_checkpoint
    config.load_universal_checkpoint = universal
    try:
        load_path, client_state = engine.load_checkpoint(str(load_root), tag=tag)
    except Exception as exc:
        raise CheckpointError(f"DeepSpeed could not load {load_root / tag}: {exc}") from exc
    finally:
        config.load_universal_checkpoint = previous
    if load_path is None:
        raise CheckpointError(
            f"DeepSpeed loaded nothing from committed checkpoint {load_root / tag}"
        )
    if _CLIENT_STATE_KEY not in client_state:
        raise CheckpointError(
            f"{load_root / tag} was not written by training.checkpoint.checkpointer"
        )
    return client_state


# ------------------------------------------------------------------ files


def _step_dirs(root: Path) -> list[str]:
    if not root.is_dir():
        return []
    tags = [p.name for p in root.iterdir() if p.is_dir() and parse_step(p.name) is not None]
    return sorted(tags, key=parse_step)


def _make_durable(folder: Path) -> dict[str, int]:
    """fsync every file under ``folder`` and the folders; returns {relative path: size}."""
    files = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and p.name != COMMIT_MARKER):
        _fsync(path, os.O_RDONLY)
        files[path.relative_to(folder).as_posix()] = path.stat().st_size
    for sub in {p.parent for p in folder.rglob("*")} | {folder}:
        _fsync(sub, os.O_RDONLY | os.O_DIRECTORY)
    return files


def _merge_listings(listings: list[dict[str, int]]) -> dict[str, int]:
    merged: dict[str, int] = {}
    for listing in listings:
        for name, size in listing.items():
            if merged.setdefault(name, size) != size:
                raise CheckpointError(f"{name} differs in size between nodes")
    return dict(sorted(merged.items()))


def _remove_step_dir(step_dir: Path) -> None:
    # Marker first: a folder whose removal is interrupted is never taken as committed.
    (step_dir / COMMIT_MARKER).unlink(missing_ok=True)
    shutil.rmtree(step_dir, ignore_errors=True)


def write_atomically(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` so that a reader sees the old or the new file, whole."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    _fsync(path.parent, os.O_RDONLY | os.O_DIRECTORY)


def _fsync(path: Path, flags: int) -> None:
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ------------------------------------------------------------ distributed


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def _rank() -> int:
    return dist.get_rank() if _distributed() else 0


def _barrier() -> None:
    if _distributed():
        dist.barrier()


def _log_rank0(level: int, message: str, *args: Any) -> None:
    if _rank() == 0:
        log.log(level, message, *args)


def _collective(work: Callable[[], T], *, runs_here: bool) -> list[T]:
    """Run ``work`` where ``runs_here``; every rank gets the results of all that ran it.

    An exception anywhere becomes a CheckpointError on every rank, so no rank
    is left waiting in a collective that a failed rank never reaches.
    """
    outcome: tuple[bool, Any, str | None] = (False, None, None)  # (ran, result, error)
    original: BaseException | None = None
    if runs_here:
        try:
            outcome = (True, work(), None)
        except Exception as exc:
            original = exc
            message = (
                str(exc) if isinstance(exc, CheckpointError) else f"{type(exc).__name__}: {exc}"
            )
            outcome = (True, None, f"rank {_rank()}: {message}")
    if _distributed() and dist.get_world_size() > 1:
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, outcome)
    else:
        gathered = [outcome]
    errors = [error for _, _, error in gathered if error is not None]
    if errors:
        raise CheckpointError("; ".join(errors)) from original
    return [result for ran, result, _ in gathered if ran]


def _on_rank0(work: Callable[[], T]) -> T:
    return _collective(work, runs_here=_rank() == 0)[0]
