"""Crash-safe DeepSpeed checkpoints: the save's steps in order, and resume.

Each concern has its module: ``writer`` (the checkpoint engine DeepSpeed writes through,
with the host copy behind asynchronous saves), ``commit`` (fsync, checksums, manifest),
``mirroring`` (the remote copy, any ``store.CheckpointStore``), ``pruning``, ``resume``
and ``collectives`` (which ranks do the file work). The folder layout and the manifest
are ``layout``'s.

Saves go through DeepSpeed's public ``engine.save_checkpoint`` and loads through
``engine.load_checkpoint`` (https://deepspeed.readthedocs.io/en/latest/model-checkpointing.html),
always with an explicit tag; DeepSpeed's own ``latest`` file is never written or read:
it is not written atomically, and a missing one makes ``load_checkpoint`` start from
scratch without an error.

The root may be shared by all nodes (one filesystem) or local to each node. A
node-local folder holds only that node's part of the checkpoint (its manifest still
lists every file), and the mirror is what joins the parts: on resume each node
fetches what it lacks.

Saves are asynchronous when asked for: the writer copies the state to host memory,
and writing, checksums, fsyncs, the commit, the upload and pruning then run in a
background thread, one save at a time. The host buffers of a save are kept once its
write is over, for the next save to copy into (``writer.StagingBuffers``).
"""

from __future__ import annotations

import logging
import os
import shutil
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import psutil

from training.checkpoint import writer as writer_module
from training.checkpoint.collectives import Ranks, log_on_rank0, rank, world_size
from training.checkpoint.commit import commit, make_durable, merge_listings, remove_step_dir
from training.checkpoint.damaged import set_aside
from training.checkpoint.errors import CheckpointError, DiskFullError
from training.checkpoint.layout import (
    CLIENT_STATE_KEY,
    COMPLETE,
    DAMAGED,
    DEEPSPEED_RECOVERY_SCRIPTS,
    PARAMETER_GROUPS_KEY,
    PARTIAL,
    UNIVERSAL_INFO,
    UNIVERSAL_INFO_KEY,
    committed_tags,
    examine,
    tag_for,
)
from training.checkpoint.mirroring import mirror_step
from training.checkpoint.pruning import prune_local, prune_mirror
from training.checkpoint.resume import ResumePoint, choose, load
from training.checkpoint.resume_check import engine_precision, refusal
from training.checkpoint.store import CheckpointStore
from training.checkpoint.writer import HostCopyWriter, StagingBuffers, writing_through
from training.private_apis import stage_0_parameter_groups
from training.spec.config import ConfigError

__all__ = ["CheckpointError", "Checkpointer", "DiskFullError"]

log = logging.getLogger(__name__)

# At most this many threads checksum a rank's host copy (memory bandwidth bounds the rest).
_DIGEST_THREADS = 4
# Free space below this after a failed write means the disk filled (torch's writer
# reports ENOSPC as "basic_ios::clear: iostream error", without the errno).
_LOW_SPACE = 1 << 20


class Checkpointer:
    def __init__(
        self,
        root: Path,
        *,
        keep_last: int = 3,
        mirror: CheckpointStore | None = None,
        asynchronous: bool = False,
        node_first_rank: bool = True,
        ranks_per_node: int = 1,
        on_progress: Callable[[], None] | None = None,
    ):
        """``node_first_rank``: this process is its node's first rank (local rank 0), the
        one that does a node-local root's file work; ``ranks_per_node`` share the node's
        host memory for asynchronous saves; ``on_progress`` is called, from the training
        thread or the writer's, whenever part of a save or a resume is done (each file
        written, each collective step): the hang watchdog's heartbeat."""
        if keep_last < 1:
            raise ValueError(f"keep_last={keep_last!r} must be at least 1 (the newest checkpoint)")
        if ranks_per_node < 1:
            raise ValueError(f"ranks_per_node={ranks_per_node!r} must be at least 1")
        self.root = Path(root)
        self.keep_last = keep_last
        self.mirror = mirror
        self.asynchronous = asynchronous
        self.ranks_per_node = ranks_per_node
        # Threads that checksum the host copy as it is made: the rank's share of the cores.
        self._digest_threads = max(1, min(_DIGEST_THREADS, (os.cpu_count() or 1) // ranks_per_node))
        self._progress = on_progress or _nothing
        self._ranks = Ranks(node_first_rank=node_first_rank, on_progress=on_progress)
        self._background: ThreadPoolExecutor | None = None
        self._in_flight: Future | None = None
        self._staging = StagingBuffers()
        self._said_short_of_memory = False
        # What choose_resume picked, for the next resume: (point,), or None when not chosen.
        self._chosen: tuple[ResumePoint | None] | None = None

    # ----------------------------------------------------------------- save

    def save(self, engine, step: int, client_state: dict, *, wait: bool = False) -> Path:
        """Write, commit, mirror and prune the checkpoint of ``step``. Every rank calls it.

        Asynchronous, it returns once the state is in host memory and the rest goes on in
        the background; ``wait`` (or a synchronous Checkpointer) returns once it is
        committed. A save in flight is finished first: at most one at a time.
        """
        self.wait()
        self._prepare()
        ranks = self._ranks
        tag = tag_for(step)
        step_dir = self.root / tag
        if all(ranks.on_writers(lambda: self._committed_and_verified(step_dir))):
            log_on_rank0(log, logging.INFO, "%s is already committed; not writing it again", tag)
            return step_dir
        # Committed on some nodes only (one was replaced): those copies go too, so that
        # no committed folder is rewritten in place.
        ranks.on_writers(lambda: self._clear_save_dir(step_dir))
        ranks.on_writers(self._warn_if_short_of_space)
        in_background = self.asynchronous and not wait
        budget = (
            writer_module.host_copy_budget(self.ranks_per_node, self._staging)
            if in_background
            else 0
        )
        files = HostCopyWriter(
            engine.checkpoint_engine,
            budget=budget,
            staging=self._staging,
            on_written=self._progress,
            digest_threads=self._digest_threads,
        )
        saved_state = {CLIENT_STATE_KEY: client_state}
        if getattr(engine.module, UNIVERSAL_INFO_KEY, None) is None:
            # DeepSpeed's AutoTP leaves a description of its split layers on the module
            # (collect_autotp_universal_checkpoint_info, deepspeed/module_inject/layers.py),
            # which client_state would replace (DeepSpeedEngine._save_checkpoint updates the
            # saved state with it last).
            saved_state |= UNIVERSAL_INFO
        with writing_through(engine, files):
            try:
                engine.save_checkpoint(
                    str(self.root), tag=tag, client_state=saved_state, save_latest=False
                )
            except OSError as exc:
                # DeepSpeed's copy of its recovery scripts (rank 0, after its last file) is
                # the one write outside the writer, and it raises. The other ranks then wait
                # in the save's last barrier, where no collective of ours can reach them:
                # this rank stops here, and the launcher ends the others.
                self._drop_recovery_scripts()
                remove_step_dir(step_dir)
                error = CheckpointError(f"could not write DeepSpeed's files in {self.root}: {exc}")
                raise self._explain(error, step_dir) from exc
            finally:
                files.copied()
                self._staging.copies_done()
        self._progress()
        if in_background and files.short_of_memory and not self._said_short_of_memory:
            self._said_short_of_memory = True
            log.warning(
                "rank %d: host memory cannot hold a copy of the checkpoint (%s available): "
                "saving the rest of it while training waits, as without "
                "checkpoint.asynchronous",
                rank(),
                _bytes(psutil.virtual_memory().available),
            )
        record = {
            "tag": tag,
            "step": step,
            "dp_world_size": data_parallel_ranks(engine),
            "tensor": engine.autotp_size() or 1,
            "sequence": sequence_ranks(engine),
            "zero_stage": engine.zero_optimization_stage(),
            "precision": engine_precision(engine),
        }
        if record["zero_stage"] == 0:
            record[PARAMETER_GROUPS_KEY] = [
                [engine.param_names[param] for param in group]
                for group in stage_0_parameter_groups(engine)
            ]
        if not in_background:
            self._finish(step_dir, record, files)
            return step_dir
        if self._background is None:
            self._background = ThreadPoolExecutor(1, thread_name_prefix="checkpoint-writer")
        self._in_flight = self._background.submit(self._finish, step_dir, record, files)
        return step_dir

    def wait(self) -> None:
        """Every rank: return once the save in flight (if any) is committed, or raise its
        error (a CheckpointError)."""
        in_flight, self._in_flight = self._in_flight, None
        if in_flight is None:
            return
        try:
            in_flight.result()
        finally:
            # Written (or failed): its staging buffers are free for the next save's copy.
            self._staging.writes_done()
            self._progress()

    def close(self) -> None:
        """Every rank, once done saving: wait for the save in flight, then let go of the
        staging buffers and the writer thread."""
        try:
            self.wait()
        finally:
            self._staging.release()
            if self._background is not None:
                self._background.shutdown()
                self._background = None

    @property
    def in_flight(self) -> bool:
        return self._in_flight is not None and not self._in_flight.done()

    def _finish(self, step_dir: Path, record: dict, files: HostCopyWriter) -> None:
        """The save after the copy: write, checksum, fsync, commit, mirror, prune."""
        ranks = self._ranks
        try:
            files.write_pending()
            ranks.on_writers(self._drop_recovery_scripts)
            # Each rank checksums the files it wrote, all ranks at once, while the bytes are
            # still in the page cache; a write that failed on any rank fails the save on all.
            reported = merge_listings(ranks.on_all(lambda: files.entries(step_dir)))
            listed = merge_listings(ranks.on_writers(lambda: make_durable(step_dir, reported)))
            saved_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            record = {**record, "saved_at": saved_at, "files": listed}
            ranks.on_writers(lambda: commit(self.root, record))
        except CheckpointError as error:
            # Nothing half-written stays behind; the committed checkpoints are untouched.
            ranks.on_writers(lambda: remove_step_dir(step_dir))
            raise self._explain(error, step_dir) from error
        if self.mirror is not None:
            mirror_step(ranks, self.mirror, step_dir, record["tag"])
        ranks.on_writers(lambda: prune_local(self.root, self.keep_last))
        if self.mirror is not None:
            ranks.on_rank0(lambda: prune_mirror(self.mirror, self.keep_last))

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

    def _committed_and_verified(self, step_dir: Path) -> bool:
        """Writers: whether ``step_dir`` holds this step's checkpoint, committed (here or by
        an earlier run) and every file matching its checksum (on a node-local root, this
        node's part of it); a damaged one is set aside, to be written again."""
        state, reason = examine(step_dir, verify=True)
        if state == DAMAGED:
            set_aside(step_dir, self.root, reason, then=f"writing {step_dir.name} again")
        # On a root every rank shares, a folder missing files is no checkpoint (a download
        # cut short), only on a node-local one is it this node's part.
        return state == COMPLETE or (state == PARTIAL and not self._ranks.shared_root)

    def _clear_save_dir(self, step_dir: Path) -> None:
        if step_dir.exists():
            log.warning("removing %s, left by an earlier run", step_dir)
            remove_step_dir(step_dir)
        self.root.mkdir(parents=True, exist_ok=True)

    def _drop_recovery_scripts(self) -> None:
        """DeepSpeed copies these beside every ZeRO save (layout.DEEPSPEED_RECOVERY_SCRIPTS
        says why they go)."""
        for name in DEEPSPEED_RECOVERY_SCRIPTS:
            (self.root / name).unlink(missing_ok=True)

    # --------------------------------------------------------------- resume

    def choose_resume(
        self,
        dp_world_size: int,
        tensor: int = 1,
        zero_stage: int | None = None,
        sequence: int = 1,
    ) -> ResumePoint | None:
        """The newest committed checkpoint, local or in the mirror, made ready to load on
        ``dp_world_size`` data-parallel ranks of ``tensor``-way tensor groups or
        ``sequence``-way sequence groups at ZeRO stage ``zero_stage`` (None: the saving
        run's); None when none was ever committed.

        Every rank calls it, before building the engine: a point saved by another number
        of ranks or at another ZeRO stage (``universal``) needs an engine built with
        DeepSpeed's checkpoint.load_universal (training.engine.build_engine). ``resume``
        loads it.
        """
        self.wait()
        self._prepare()
        point = choose(
            dp_world_size, self.root, self.mirror, self._ranks, tensor, zero_stage, sequence
        )
        self._chosen = (point,)
        return point

    def resume(self, engine) -> dict | None:
        """Load the chosen checkpoint (``choose_resume``; chosen for ``engine``'s
        data-parallel size when not yet) into ``engine``, freshly built; every rank calls it.

        Returns the saved client_state, or None when no checkpoint was ever committed.
        Raises ConfigError (one line, as the launcher's check) for an engine of another ZeRO
        stage or precision than the checkpoint's.
        """
        if self._chosen is None:
            self.choose_resume(
                data_parallel_ranks(engine),
                engine.autotp_size() or 1,
                engine.zero_optimization_stage(),
                sequence_ranks(engine),
            )
        (point,), self._chosen = self._chosen, None
        if point is None:
            return None
        problem = refusal(
            str(self.root / point.tag),
            point.manifest,
            zero_stage=engine.zero_optimization_stage(),
            precision=engine_precision(engine),
            tensor=engine.autotp_size() or 1,
        )
        if problem is not None:
            raise ConfigError(problem)
        return load(engine, point)

    # ------------------------------------------------------ who does file work

    def _prepare(self) -> None:
        """Every rank, from the training thread: the collectives' group, and (once) whether
        the root is shared, which says who writes."""
        self._ranks.open()
        if self._ranks.shared_root is None:
            self._ranks.shared_root = self._probe_shared_root()

    def _probe_shared_root(self) -> bool:
        """Whether every rank sees the same root: rank 0 leaves a file there, all look."""
        if world_size() == 1:
            return True

        def leave_probe() -> str:
            self.root.mkdir(parents=True, exist_ok=True)
            probe = self.root / f".probe-{uuid.uuid4().hex}"
            probe.touch()
            return probe.name

        # Each rank looks in its own root: the same path may name another disk there.
        ranks = self._ranks
        probe = ranks.on_rank0(leave_probe)
        shared = all(ranks.on_all((self.root / probe).exists))
        ranks.on_rank0((self.root / probe).unlink)
        if shared:
            log_on_rank0(log, logging.INFO, "checkpoint root %s is shared by every rank", self.root)
        else:
            log_on_rank0(
                log,
                logging.WARNING if self.mirror is None else logging.INFO,
                "checkpoint root %s is local to each node: each node keeps its part%s",
                self.root,
                ", joined through S3 on resume"
                if self.mirror is not None
                else "; without TRAIN_S3_URI no node can resume from the others' parts",
            )
        return shared


def _nothing() -> None:
    pass


def _folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def _bytes(count: int) -> str:
    """A byte count for messages: exact, with MiB beside it when that helps."""
    return (
        f"{count:,} bytes" if count < 1 << 20 else f"{count:,} bytes ({count / (1 << 20):.1f} MiB)"
    )


def sequence_ranks(engine) -> int:
    """The ranks of the engine's Ulysses sequence groups (1: none)."""
    return getattr(engine, "sequence_parallel_size", 1) or 1


def data_parallel_ranks(engine) -> int:
    """The engine's data-parallel ranks. Under Ulysses DeepSpeed leaves dp_world_size None
    and counts sequence x data ranks in seq_dp_world_size (engine.py,
    _configure_distributed_model; utils/groups.py)."""
    if engine.dp_world_size is not None:
        return engine.dp_world_size
    return engine.seq_dp_world_size // sequence_ranks(engine)
