"""Crash-safe DeepSpeed checkpoints: commit manifest, keep-last pruning, a remote mirror, resume.

The folder layout and the manifest are ``training.checkpoint.layout``'s; the
remote copy is any ``training.checkpoint.store.CheckpointStore`` (the S3 mirror
in the stack), and ``universal/step_NNNNNNNN/`` holds a converted copy made when
the data-parallel size changes.

DeepSpeed's own ``latest`` file is never written or read: it is not written
atomically, and a missing one makes ``load_checkpoint`` start from scratch
without an error.

The root may be shared by all nodes (one filesystem) or local to each node.
Rank 0 does the file work on a shared root; on node-local roots each node's
first rank does it for its node. A node-local folder then holds only that
node's part of the checkpoint (its manifest still lists every file), and the
mirror is what joins the parts: on resume each node fetches what it lacks.

Saves are asynchronous when asked for: DeepSpeed hands every file's state to a
checkpoint engine of ours (its ``CheckpointEngine`` seam), which copies the
tensors to host memory; writing, checksums, fsyncs, the commit, the upload and
pruning then run in a background thread, one save at a time. Their collectives
go through a gloo process group of their own, so that they never interleave with
the training thread's (torchtitan's async checkpointing does the same:
https://github.com/pytorch/torchtitan/blob/main/docs/checkpoint.md).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import logging
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import psutil
import torch
import torch.distributed as dist
from deepspeed.runtime.checkpoint_engine.checkpoint_engine import (
    CheckpointCommitInfo,
    CheckpointEngine,
)

from training.checkpoint.layout import (
    COMMIT_MARKER,
    COMPLETE,
    DAMAGED,
    DEEPSPEED_RECOVERY_SCRIPTS,
    PARTIAL,
    POINTER_NAME,
    UNCOMMITTED,
    UNIVERSAL_DIR,
    committed_tags,
    describe_file,
    examine,
    fsync_path,
    manifest_bytes,
    parse_step,
    read_manifest,
    step_dirs,
    tag_for,
    write_atomically,
)
from training.checkpoint.resume_check import engine_precision
from training.checkpoint.store import CheckpointStore, prune

log = logging.getLogger(__name__)

# ds_to_universal refuses checkpoints that lack this client_state entry.
_UNIVERSAL_INFO = {"universal_checkpoint_info": {"universal_checkpoint_version": 0.2}}
# The caller's client_state sits under one key, apart from DeepSpeed's own entries.
_CLIENT_STATE_KEY = "training_client_state"
# Free space below this after a failed write means the disk filled (torch's writer
# reports ENOSPC as "basic_ios::clear: iostream error", without the errno).
_LOW_SPACE = 1 << 20
# A host copy may take at most this share of the memory available when a save begins
# (shared by the node's ranks): the rest stays for the data loaders and the page cache.
_HOST_COPY_SHARE = 0.5

T = TypeVar("T")


class CheckpointError(RuntimeError):
    """A checkpoint exists but cannot be written, committed or loaded."""


class DiskFullError(CheckpointError):
    """The checkpoint root's filesystem ran out of space during a save."""


class Checkpointer:
    def __init__(
        self,
        root: Path,
        *,
        keep_last: int = 3,
        mirror: CheckpointStore | None = None,
        asynchronous: bool = False,
    ):
        if keep_last < 1:
            raise ValueError(f"keep_last={keep_last!r} must be at least 1 (the newest checkpoint)")
        self.root = Path(root)
        self.keep_last = keep_last
        self.mirror = mirror
        self.asynchronous = asynchronous
        self._shared_root: bool | None = None  # found out on first use, by every rank at once
        self._verified: set[str] = set()  # tags whose checksums this process checked
        self._group = None  # the checkpointer's own gloo group (None: the default one)
        self._writer: ThreadPoolExecutor | None = None
        self._in_flight: Future | None = None
        self._said_short_of_memory = False

    # ----------------------------------------------------------------- save

    def save(self, engine, step: int, client_state: dict, *, wait: bool = False) -> Path:
        """Write, commit, mirror and prune the checkpoint of ``step``. Every rank calls it.

        Asynchronous, it returns once the state is in host memory and the rest goes on in
        the background; ``wait`` (or a synchronous Checkpointer) returns once it is
        committed. A save in flight is finished first: at most one at a time.
        """
        self.wait()
        self._use_own_group()
        tag = tag_for(step)
        step_dir = self.root / tag
        if all(self._on_writers(lambda: examine(step_dir)[0] in (COMPLETE, PARTIAL))):
            _log_rank0(logging.INFO, "%s is already committed; not writing it again", tag)
            return step_dir
        # Committed on some nodes only (one was replaced): those copies go too, so that
        # no committed folder is rewritten in place.
        self._on_writers(lambda: self._clear_save_dir(step_dir))
        self._on_writers(self._warn_if_short_of_space)
        in_background = self.asynchronous and not wait
        files = _HostCopyEngine(
            engine.checkpoint_engine, budget=_host_copy_budget() if in_background else 0
        )
        saved_state = {_CLIENT_STATE_KEY: client_state, **_UNIVERSAL_INFO}
        with _writing_through(engine, files):
            engine.save_checkpoint(
                str(self.root), tag=tag, client_state=saved_state, save_latest=False
            )
        if in_background and files.short_of_memory and not self._said_short_of_memory:
            self._said_short_of_memory = True
            log.warning(
                "rank %d: host memory cannot hold a copy of the checkpoint (%s available): "
                "saving the rest of it while training waits, as without "
                "checkpoint.asynchronous",
                _rank(),
                _bytes(psutil.virtual_memory().available),
            )
        record = {
            "tag": tag,
            "step": step,
            "dp_world_size": engine.dp_world_size,
            "zero_stage": engine.zero_optimization_stage(),
            "precision": engine_precision(engine),
        }
        if not in_background:
            self._finish(step_dir, record, files)
            return step_dir
        if self._writer is None:
            self._writer = ThreadPoolExecutor(1, thread_name_prefix="checkpoint-writer")
        self._in_flight = self._writer.submit(self._finish, step_dir, record, files)
        return step_dir

    def wait(self) -> None:
        """Every rank: return once the save in flight (if any) is committed, or raise its
        error (a CheckpointError)."""
        in_flight, self._in_flight = self._in_flight, None
        if in_flight is not None:
            in_flight.result()

    @property
    def in_flight(self) -> bool:
        return self._in_flight is not None and not self._in_flight.done()

    def _finish(self, step_dir: Path, record: dict, files: _HostCopyEngine) -> None:
        """The save after the copy: write, checksum, fsync, commit, mirror, prune."""
        try:
            files.write_pending()
            self._on_writers(self._drop_recovery_scripts)
            # Each rank checksums the files it wrote, all ranks at once, while the bytes are
            # still in the page cache; a write that failed on any rank fails the save on all.
            reported = _merge_listings(self._collective(lambda: files.entries(step_dir)))
            listed = _merge_listings(self._on_writers(lambda: _make_durable(step_dir, reported)))
            saved_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            record = {**record, "saved_at": saved_at, "files": listed}
            self._on_writers(lambda: self._commit(step_dir, record))
        except CheckpointError as error:
            # Nothing half-written stays behind; the committed checkpoints are untouched.
            self._on_writers(lambda: _remove_step_dir(step_dir))
            raise self._explain(error, step_dir) from error
        if self.mirror is not None:
            self._mirror(step_dir, record["tag"])
        self._on_writers(self._prune_local)
        if self.mirror is not None:
            self._on_rank0(self._prune_mirror)

    def _use_own_group(self) -> None:
        """Every rank, from the training thread: make the gloo group the background saves
        talk through (a group is created by all ranks together, in the same order)."""
        if self._group is None and _distributed() and dist.get_world_size() > 1:
            self._group = dist.new_group(backend="gloo")

    def _warn_if_short_of_space(self) -> None:
        """Writers: say before the save, not after, when the last checkpoint would not fit."""
        committed = committed_tags(self.root)
        if not committed:
            return
        needed = _folder_bytes(self.root / committed[-1])
        free = shutil.disk_usage(self.root).free
        if free < needed:
            log.warning(
                "%s has %s free, less than the last checkpoint's %s: this save will likely "
                "fail with 'No space left on device'; free space there or lower "
                "checkpoint.keep_last",
                self.root,
                _bytes(free),
                _bytes(needed),
            )

    def _explain(self, error: CheckpointError, step_dir: Path) -> CheckpointError:
        """A DiskFullError naming the folder, the sizes and the way out, when that is what
        happened; ``error`` otherwise."""
        if not self.root.is_dir():
            return error
        free = shutil.disk_usage(self.root).free
        committed = committed_tags(self.root)
        needed = _folder_bytes(self.root / committed[-1]) if committed else None
        out_of_space = "No space left" in str(error) or free < max(needed or 0, _LOW_SPACE)
        if not out_of_space:
            return error
        size = (
            f"about {_bytes(needed)} (the size of {committed[-1]})"
            if needed
            else "more than was free"
        )
        return DiskFullError(
            f"No space left on device in {step_dir.parent}: the checkpoint {step_dir.name} needs "
            f"{size} and {_bytes(free)} are free there. The half-written {step_dir.name} was "
            "removed and the checkpoints committed before it are intact: free space on that "
            "disk, point TRAIN_CHECKPOINT_DIR (checkpoint.dir) at a bigger one, or lower "
            f"checkpoint.keep_last, then run the same command again ({error})"
        )

    def _clear_save_dir(self, step_dir: Path) -> None:
        if step_dir.exists():
            log.warning("removing %s, left by an earlier run", step_dir)
            _remove_step_dir(step_dir)
        self.root.mkdir(parents=True, exist_ok=True)

    def _commit(self, step_dir: Path, record: dict) -> None:
        write_atomically(step_dir / COMMIT_MARKER, manifest_bytes(record))
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
            self._on_rank0(commit_in_s3)

    def _prune_local(self) -> None:
        states = {tag: examine(self.root / tag)[0] for tag in step_dirs(self.root)}
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
            for tag in prune(self.mirror, self.keep_last):
                log.info("pruned checkpoint %s/%s", self.mirror.uri, tag)
        except Exception:
            log.exception("could not prune old checkpoints in %s", self.mirror.uri)

    # --------------------------------------------------------------- resume

    def resume(self, engine) -> dict | None:
        """Load the newest committed checkpoint, local or S3, into ``engine``.

        Every rank calls it, on a freshly built engine. Returns the saved
        client_state, or None when no checkpoint was ever committed.
        """
        self.wait()
        self._use_own_group()
        remote = self._on_rank0(self._remote_tags)
        refused: set[str] = set()
        while True:
            inventories = self._on_writers(lambda: self._inventory(refused))
            tag = _choose(inventories, [t for t in remote if t not in refused])
            if tag is None:
                break
            try:
                self._on_writers(lambda tag=tag: self._make_complete(tag, remote))
            except CheckpointError as error:
                _log_rank0(
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
        record = read_manifest(self.root / tag)

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

    def _inventory(self, refused: set[str]) -> dict[str, str]:
        """Writers: state of every committed step folder here (the others are logged).

        Newest first, each folder's checksums are verified until one is complete;
        the older ones are only sized, since resume will not reach them.
        """
        inventory = {}
        verifying = True
        for tag in reversed(step_dirs(self.root)):
            if tag in refused:
                continue
            state, reason = examine(self.root / tag, verify=verifying)
            if state == COMPLETE and verifying:
                self._verified.add(tag)
                verifying = False
            if state != COMPLETE:
                level = logging.INFO if state == PARTIAL else logging.WARNING
                log.log(level, "%s is %s: %s", self.root / tag, state, reason)
            if state != UNCOMMITTED:
                inventory[tag] = state
        return dict(reversed(inventory.items()))

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
        state, reason = (
            (COMPLETE, "verified") if tag in self._verified else examine(folder, verify=True)
        )
        if state == COMPLETE:
            log.info("loading %s from local disk", folder)
            return
        if tag not in remote:
            raise CheckpointError(f"{folder} cannot be loaded ({reason}) and S3 has no copy")
        log.info("fetching %s from %s (%s here: %s)", tag, self.mirror.uri, state, reason)
        if state == DAMAGED:
            _remove_step_dir(folder)  # a same-size damaged file would otherwise be kept
        self.mirror.download(tag, self.root)
        state, reason = examine(folder, verify=True)
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
        record = read_manifest(self.root / tag)
        record["files"] = _make_durable(out, {})
        write_atomically(out / COMMIT_MARKER, manifest_bytes(record))

    # ------------------------------------------------------ who does file work

    def _drop_recovery_scripts(self) -> None:
        for name in DEEPSPEED_RECOVERY_SCRIPTS:
            (self.root / name).unlink(missing_ok=True)

    def _on_writers(self, work: Callable[[], T]) -> list[T]:
        """Run ``work`` on the ranks that touch files; every rank gets all their results."""
        return _collective(work, runs_here=self._is_writer(), group=self._group)

    def _on_rank0(self, work: Callable[[], T]) -> T:
        return _collective(work, runs_here=_rank() == 0, group=self._group)[0]

    def _collective(self, work: Callable[[], T]) -> list[T]:
        """Run ``work`` on every rank; every rank gets all the results."""
        return _collective(work, runs_here=True, group=self._group)

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
        probe = self._on_rank0(leave_probe)
        shared = all(self._collective((self.root / probe).exists))
        self._on_rank0((self.root / probe).unlink)
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


def _make_durable(folder: Path, known: dict[str, dict]) -> dict[str, dict]:
    """fsync every file under ``folder`` and the folders; returns each file's manifest entry.

    ``known`` holds the entries the writing ranks computed; a file no rank reported
    (written by DeepSpeed outside its checkpoint engine) is checksummed here.
    """
    files = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and p.name != COMMIT_MARKER):
        fsync_path(path)
        name = path.relative_to(folder).as_posix()
        entry = known.get(name)
        if entry is None or entry["size"] != path.stat().st_size:
            entry = describe_file(path)
        files[name] = entry
    for sub in {p.parent for p in folder.rglob("*")} | {folder}:
        fsync_path(sub, directory=True)
    return files


def _merge_listings(listings: list[dict[str, dict]]) -> dict[str, dict]:
    merged: dict[str, dict] = {}
    for listing in listings:
        for name, entry in listing.items():
            if merged.setdefault(name, entry) != entry:
                raise CheckpointError(f"{name} differs between nodes ({merged[name]} vs {entry})")
    return dict(sorted(merged.items()))


class _HostCopyEngine(CheckpointEngine):
    """The checkpoint engine DeepSpeed writes through during one save (its documented
    ``CheckpointEngine`` seam, deepspeed/runtime/checkpoint_engine/checkpoint_engine.py).

    Each file's state is copied to host memory while ``budget`` bytes last, and written
    later by ``write_pending`` through the engine DeepSpeed was configured with; past
    the budget (and with a budget of 0: a blocking save) it is written at once. Every
    file written is noted. A failed write is recorded rather than raised: DeepSpeed's
    save goes through barriers after each file, and a rank leaving early would leave
    the others waiting there; ``entries`` turns it into an error.
    """

    def __init__(self, writer: CheckpointEngine, *, budget: int):
        super().__init__()
        self.name = "host copy"
        self.writer = writer
        self.budget = budget
        self.short_of_memory = False
        self.pending: list[tuple[dict, str]] = []
        self.paths: list[Path] = []
        self.failures: list[str] = []
        self._info: CheckpointCommitInfo | None = None

    def create(self, info: CheckpointCommitInfo) -> None:
        self._info = info
        self.writer.create(info)

    def makedirs(self, path, exist_ok=False) -> None:
        self.writer.makedirs(path, exist_ok=exist_ok)

    def save(self, state_dict, path: str) -> None:
        size = _tensor_bytes(state_dict)
        if size <= self.budget:
            self.budget -= size
            self.pending.append((_host_copy(state_dict), path))
            return
        self.short_of_memory = self.short_of_memory or self.budget > 0
        self.budget = 0  # the files stay in order: all the rest is written now
        if self.writer.preserves_storage_sharing():
            # What DeepSpeed does for such an engine (a view is saved alone, not its storage),
            # but keeping the containers' types: DeepSpeed's clone_tensors_for_torch_save turns
            # a ZeRO-3 checkpoint's torch.Size param_shapes into tuples, which its own
            # zero_to_fp32 cannot export (shape.numel()).
            state_dict = _host_copy(state_dict)
        self._write(state_dict, path)

    def load(self, path: str, map_location=None):
        return self.writer.load(path, map_location=map_location)

    def commit(self, info: CheckpointCommitInfo) -> bool:
        # With files still in memory, the configured engine commits after write_pending.
        return True if self.pending else self.writer.commit(info)

    def is_data_parallel_writer(self, dp_rank) -> bool:
        return self.writer.is_data_parallel_writer(dp_rank)

    def preserves_storage_sharing(self) -> bool:
        return False  # every tensor is copied (or cloned) on its own before it is written

    def write_pending(self) -> None:
        if not self.pending:
            return
        while self.pending:
            state, path = self.pending.pop(0)
            self._write(state, path)
            del state  # its host memory goes back file by file
        if self._info is not None:
            self.writer.commit(self._info)

    def entries(self, step_dir: Path) -> dict[str, dict]:
        if self.failures:
            raise CheckpointError("; ".join(self.failures))
        return {
            path.relative_to(step_dir).as_posix(): describe_file(path)
            for path in self.paths
            if path.is_relative_to(step_dir)
        }

    def _write(self, state_dict, path: str) -> None:
        try:
            self.writer.save(state_dict, path)
        except Exception as exc:
            reason = os.strerror(errno.ENOSPC) if _is_enospc(exc) else f"{type(exc).__name__}"
            self.failures.append(f"could not write {path}: {reason}: {exc}")
            with contextlib.suppress(OSError):
                Path(path).unlink()
        else:
            self.paths.append(Path(path))


@contextlib.contextmanager
def _writing_through(engine, files: _HostCopyEngine) -> Iterator[None]:
    """DeepSpeed's save of ``engine`` goes through ``files`` instead of its own engine."""
    configured = engine.checkpoint_engine
    engine.checkpoint_engine = files
    # DeepSpeed's recovery scripts are removed after every save (DEEPSPEED_RECOVERY_SCRIPTS):
    # not copying them at all also keeps a full disk from failing outside the engine.
    engine._copy_recovery_script = lambda save_path: None
    try:
        yield
    finally:
        engine.checkpoint_engine = configured
        del engine._copy_recovery_script  # the class's method again


def _host_copy(value):
    """``value`` with every tensor copied to host memory, each into storage of its own."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return type(value)((key, _host_copy(item)) for key, item in value.items())
    if isinstance(value, list | tuple):
        items = [_host_copy(item) for item in value]
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
    return value


def _tensor_bytes(value) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, dict):
        return sum(_tensor_bytes(item) for item in value.values())
    if isinstance(value, list | tuple):
        return sum(_tensor_bytes(item) for item in value)
    return 0


def _host_copy_budget() -> int:
    """The bytes this rank may copy to host memory: its share of a share of what is free."""
    ranks_here = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    return int(psutil.virtual_memory().available * _HOST_COPY_SHARE) // ranks_here


def _is_enospc(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno == errno.ENOSPC


def _folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def _bytes(count: int) -> str:
    """A byte count for messages: exact, with MiB beside it when that helps."""
    return (
        f"{count:,} bytes" if count < 1 << 20 else f"{count:,} bytes ({count / (1 << 20):.1f} MiB)"
    )


def _remove_step_dir(step_dir: Path) -> None:
    # Marker first: a folder whose removal is interrupted is never taken as committed.
    (step_dir / COMMIT_MARKER).unlink(missing_ok=True)
    shutil.rmtree(step_dir, ignore_errors=True)


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


def _collective(work: Callable[[], T], *, runs_here: bool, group=None) -> list[T]:
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
        dist.all_gather_object(gathered, outcome, group=group)
    else:
        gathered = [outcome]
    errors = [error for _, _, error in gathered if error is not None]
    if errors:
        raise CheckpointError("; ".join(errors)) from original
    return [result for ran, result, _ in gathered if ran]
