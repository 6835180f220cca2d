"""Crash-safe DeepSpeed checkpoints: commit marker, keep-last pruning, S3 mirror, resume.

Layout under the checkpoint root (``TRAIN_CHECKPOINT_DIR``):

    step_00000100/            DeepSpeed's files for step 100
    step_00000100/commit.json written last: the checkpoint counts only once it exists
    latest_committed          names the newest committed step (for people and tools)
    universal/step_00000100/  converted copy, made when the world size changes

DeepSpeed's own ``latest`` file is never written or read: it is not written
atomically and a missing one makes ``load_checkpoint`` start from scratch
without an error. A step folder is trusted only when its commit marker parses
and every file it lists is present with the recorded size.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import torch.distributed as dist

if TYPE_CHECKING:
    from training.s3_mirror import S3Mirror

log = logging.getLogger(__name__)

COMMIT_MARKER = "commit.json"
POINTER_NAME = "latest_committed"
UNIVERSAL_DIR = "universal"
_TAG_RE = re.compile(r"^step_(\d{8,})$")
# ds_to_universal refuses checkpoints that lack this client_state entry.
_UNIVERSAL_INFO = {"universal_checkpoint_info": {"universal_checkpoint_version": 0.2}}
# The caller's client_state sits under one key, apart from DeepSpeed's own entries.
_CLIENT_STATE_KEY = "training_client_state"

T = TypeVar("T")


class CheckpointError(RuntimeError):
    """A checkpoint exists but cannot be written, committed or loaded."""


def tag_for(step: int) -> str:
    return f"step_{step:08d}"


def parse_step(tag: str) -> int | None:
    """The step of a ``step_NNNNNNNN`` tag, or None for any other name."""
    match = _TAG_RE.match(tag)
    return int(match.group(1)) if match else None


class _Uncommitted(Exception):
    """A step folder that is not a complete checkpoint (the reason is the message)."""


class Checkpointer:
    def __init__(self, root: Path, *, keep_last: int = 3, mirror: S3Mirror | None = None):
        if keep_last < 1:
            raise ValueError(f"keep_last={keep_last!r} must be at least 1 (the newest checkpoint)")
        self.root = Path(root)
        self.keep_last = keep_last
        self.mirror = mirror

    # ----------------------------------------------------------------- save

    def save(self, engine, step: int, client_state: dict) -> Path:
        """Write, commit, mirror and prune the checkpoint of ``step``. Every rank calls it."""
        tag = tag_for(step)
        step_dir = self.root / tag
        if _on_rank0(lambda: self._prepare_save_dir(step_dir)):
            return step_dir

        saved_state = {_CLIENT_STATE_KEY: client_state, **_UNIVERSAL_INFO}
        engine.save_checkpoint(str(self.root), tag=tag, client_state=saved_state, save_latest=False)
        _barrier()  # every rank's shards are on disk before the marker is written
        record = {
            "tag": tag,
            "step": step,
            "dp_world_size": engine.dp_world_size,
            "zero_stage": engine.zero_optimization_stage(),
            "saved_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        _on_rank0(lambda: self._commit(step_dir, record))
        _on_rank0(self._publish_and_prune)
        return step_dir

    def _prepare_save_dir(self, step_dir: Path) -> bool:
        """True when ``step_dir`` is already committed (nothing to write)."""
        try:
            _verify(step_dir)
        except _Uncommitted:
            pass
        else:
            log.info("checkpoint %s is already committed; not writing it again", step_dir)
            return True
        if step_dir.exists():
            log.warning("removing uncommitted %s left by an earlier run", step_dir)
            _remove_step_dir(step_dir)
        self.root.mkdir(parents=True, exist_ok=True)
        return False

    def _commit(self, step_dir: Path, record: dict) -> None:
        files = _write_commit_marker(step_dir, record)
        _write_atomic(self.root / POINTER_NAME, record["tag"] + "\n")
        log.info("committed checkpoint %s (%d files)", step_dir, files)

    def _publish_and_prune(self) -> None:
        committed = self._committed_tags()
        if self.mirror is not None:
            newest = committed[-1]
            try:
                self.mirror.upload(self.root / newest, newest)
            except Exception:
                # A failed upload must not end the run: the local commit stands and
                # the next save uploads again.
                log.exception("could not mirror %s to %s", newest, self.mirror.uri)
        keep = set(committed[-self.keep_last :])
        for tag in self._step_dirs():
            if tag not in keep:
                log.info("pruning checkpoint %s", self.root / tag)
                _remove_step_dir(self.root / tag)
        universal = self.root / UNIVERSAL_DIR
        if universal.is_dir():
            for converted in universal.iterdir():
                if converted.is_dir() and converted.name not in keep:
                    shutil.rmtree(converted, ignore_errors=True)
        if self.mirror is not None:
            try:
                self._prune_mirror()
            except Exception:
                log.exception("could not prune old checkpoints in %s", self.mirror.uri)

    def _prune_mirror(self) -> None:
        tags = self.mirror.tags()
        committed = [tag for tag in tags if self.mirror.is_committed(tag)]
        keep = set(committed[-self.keep_last :])
        for tag in tags:
            if tag not in keep:
                log.info("pruning checkpoint %s/%s", self.mirror.uri, tag)
                self.mirror.delete(tag)

    # --------------------------------------------------------------- resume

    def resume(self, engine) -> dict | None:
        """Load the newest committed checkpoint, local or S3, into ``engine``.

        Every rank calls it, on a freshly built engine. Returns the saved
        client_state, or None when no committed checkpoint exists anywhere.
        """
        found = _on_rank0(self._locate_newest)
        if found is None:
            return None
        tag, record = found
        load_root = self.root
        if record["zero_stage"] > 0 and record["dp_world_size"] != engine.dp_world_size:
            log.info(
                "checkpoint %s was saved by %d data-parallel ranks, this run has %d: "
                "loading it through a universal checkpoint",
                tag,
                record["dp_world_size"],
                engine.dp_world_size,
            )
            _on_rank0(lambda: self._convert_to_universal(tag))
            load_root = self.root / UNIVERSAL_DIR
        loaded = self._load(engine, load_root, tag, universal=load_root != self.root)
        log.info("resumed from %s at step %d", load_root / tag, record["step"])
        return loaded[_CLIENT_STATE_KEY]

    def _locate_newest(self) -> tuple[str, dict] | None:
        """Rank 0: the newest committed tag, downloaded first when S3 has a newer one."""
        local = self._committed_tags()
        local_newest = local[-1] if local else None
        remote_newest = self.mirror.latest_tag() if self.mirror is not None else None
        if remote_newest is not None and (
            local_newest is None or parse_step(remote_newest) > parse_step(local_newest)
        ):
            log.info(
                "newest checkpoint is %s in %s (local newest: %s): downloading it",
                remote_newest,
                self.mirror.uri,
                local_newest,
            )
            self.mirror.download(remote_newest, self.root)
            try:
                return remote_newest, _verify(self.root / remote_newest)
            except _Uncommitted as exc:
                raise CheckpointError(
                    f"{remote_newest} downloaded from {self.mirror.uri} is incomplete: {exc}"
                ) from exc
        if local_newest is None:
            log.info(
                "no committed checkpoint in %s%s: starting fresh",
                self.root,
                f" or {self.mirror.uri}" if self.mirror is not None else "",
            )
            return None
        log.info("newest checkpoint is %s in %s", local_newest, self.root)
        return local_newest, _verify(self.root / local_newest)

    def _convert_to_universal(self, tag: str) -> None:
        from deepspeed.checkpoint import ds_to_universal

        out = self.root / UNIVERSAL_DIR / tag
        try:
            _verify(out)
            return
        except _Uncommitted:
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
        _write_commit_marker(out, {k: v for k, v in record.items() if k != "files"})

    @staticmethod
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
            raise CheckpointError(f"{load_root / tag} was not written by training.checkpoint")
        return client_state

    # -------------------------------------------------------------- listing

    def _step_dirs(self) -> list[str]:
        if not self.root.is_dir():
            return []
        tags = [
            p.name for p in self.root.iterdir() if p.is_dir() and parse_step(p.name) is not None
        ]
        return sorted(tags, key=parse_step)

    def _committed_tags(self) -> list[str]:
        """Committed tags, oldest first; uncommitted folders are logged and skipped."""
        committed = []
        for tag in self._step_dirs():
            try:
                _verify(self.root / tag)
            except _Uncommitted as exc:
                log.warning("ignoring %s: %s", self.root / tag, exc)
            else:
                committed.append(tag)
        return committed


def _verify(step_dir: Path) -> dict:
    """The commit record of a complete step folder; raises _Uncommitted otherwise."""
    marker = step_dir / COMMIT_MARKER
    try:
        record = json.loads(marker.read_text())
        files = record["files"]
    except FileNotFoundError:
        raise _Uncommitted(f"no {COMMIT_MARKER} (the save did not finish)") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise _Uncommitted(f"unreadable {COMMIT_MARKER}: {exc}") from None
    for name, size in files.items():
        path = step_dir / name
        if not path.is_file():
            raise _Uncommitted(f"{name} is missing")
        if path.stat().st_size != size:
            raise _Uncommitted(f"{name} has {path.stat().st_size} bytes, {size} were saved")
    return record


def _write_commit_marker(folder: Path, record: dict) -> int:
    """Make every file in ``folder`` durable, then write its marker listing them.

    Returns the number of files the marker lists.
    """
    files = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        _fsync_file(path)
        files[path.relative_to(folder).as_posix()] = path.stat().st_size
    for sub in {p.parent for p in folder.rglob("*")} | {folder}:
        _fsync_dir(sub)
    _write_atomic(folder / COMMIT_MARKER, json.dumps({**record, "files": files}, indent=1))
    return len(files)


def _remove_step_dir(step_dir: Path) -> None:
    # Marker first: a folder whose removal is interrupted is never taken as committed.
    (step_dir / COMMIT_MARKER).unlink(missing_ok=True)
    shutil.rmtree(step_dir, ignore_errors=True)


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ------------------------------------------------------------ distributed


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def _barrier() -> None:
    if _distributed():
        dist.barrier()


def _on_rank0(work: Callable[[], T]) -> T:
    """Run ``work`` on rank 0 only and give every rank its result.

    An exception on rank 0 becomes a CheckpointError on every rank, so no
    rank is left waiting in a collective that rank 0 never reaches.
    """
    result: Any = None
    error: str | None = None
    original: BaseException | None = None
    if not _distributed() or dist.get_rank() == 0:
        try:
            result = work()
        except Exception as exc:
            original = exc
            error = str(exc) if isinstance(exc, CheckpointError) else f"{type(exc).__name__}: {exc}"
    if _distributed():
        box = [(result, error)]
        dist.broadcast_object_list(box, src=0)
        result, error = box[0]
    if error is not None:
        raise CheckpointError(error) from original
    return result
