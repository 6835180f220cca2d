"""Hang detection: the workers record their progress, the launcher watches the records.

A rank stuck in a collective (a dead NCCL link, a peer that never arrives) keeps its GPU
busy, so the idle alarm never fires, and NCCL's own timeout is tens of minutes or never.
Here every rank writes the step it last finished to a file in a folder the launcher made
(HEARTBEAT_DIR_ENV), and a count of the parts of checkpoint saves it finished (each file
written, each stage of the commit): a rank waiting for a save in flight, or writing one at
the end of the run, is not silent while the save moves on. The launcher's watchdog thread
reads them; when no rank has finished a step or a part of a save for max(floor, factor x
the measured step time) (before this run's first step: the start-up bound), it

1. asks every rank, and every DataLoader worker of theirs, for its Python stack
   (faulthandler, registered on SIGUSR1 in each:
   https://docs.python.org/3/library/faulthandler.html#dumping-the-traceback-on-a-user-signal)
   and prints them to the log, labelled by rank;
2. names the ranks that stopped first: the fewest finished steps, and of those the ones
   not waiting inside a collective (the others wait there for them);
3. kills the workers, and the launcher exits with HANG_EXIT (75): the boot unit restarts
   and Slurm requeues the job, which resumes from its last committed checkpoint.
"""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import os
import signal
import statistics
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from training.contract import HANG_EXIT
from training.environment import read_environment
from training.spec.config import WatchdogConfig

log = logging.getLogger(__name__)

STACK_SIGNAL = signal.SIGUSR1
# A frame from one of these is a rank waiting for its peers, not the one that stopped.
COLLECTIVE_CODE = ("torch/distributed/", "deepspeed/comm/")
_POLL_S = 0.5
_STACK_WAIT_S = 2.0  # for every rank to write its stack after the signal
_STEP_TIMES_KEPT = 50


def _beat_file(folder: Path, rank: int) -> Path:
    return folder / f"rank-{rank}.step"


def _stack_file(folder: Path, rank: int) -> Path:
    return folder / f"rank-{rank}.stack"


def _loader_stack_file(folder: Path, rank: int, pid: int) -> Path:
    return folder / f"rank-{rank}.loader-{pid}.stack"


def install_stack_dump(folder: Path | None, rank: int) -> None:
    """Worker side, first thing: write this rank's Python stack (every thread) to its file in
    the heartbeat folder on STACK_SIGNAL, even while it is stuck in C code."""
    if folder is None:  # started without the launcher (a test's torchrun): no watchdog
        return
    _dump_on_signal(_stack_file(folder, rank))


def install_loader_stack_dump(worker_id: int) -> None:
    """A DataLoader worker's ``worker_init_fn`` (training.data.worker_processes): the same
    for the worker, into a file named by its rank and process id. A worker starts from a
    fork server, with the rank's environment: HEARTBEAT_DIR_ENV and RANK tell it where."""
    env = read_environment()
    if env.heartbeat_dir is not None and env.rank is not None:
        _dump_on_signal(_loader_stack_file(env.heartbeat_dir, env.rank, os.getpid()))


def _dump_on_signal(path: Path) -> None:
    stack = open(path, "w")  # noqa: SIM115 - open for the process's life
    faulthandler.register(STACK_SIGNAL, file=stack, all_threads=True)


class Heartbeat:
    """Worker side: `beat(step)` after each finished step, `progress()` after each part of a
    checkpoint save (from any thread); no folder (started without the launcher), no beats."""

    def __init__(self, folder: Path | None, rank: int):
        self.folder, self.rank = folder, rank
        self._step, self._progress = -1, 0
        self._lock = threading.Lock()  # the training thread and the checkpoint writer's

    def beat(self, step: int) -> None:
        with self._lock:
            self._step = step
            self._write()

    def progress(self) -> None:
        with self._lock:
            self._progress += 1
            self._write()

    def _write(self) -> None:
        if self.folder is None:
            return
        target = _beat_file(self.folder, self.rank)
        partial = target.with_suffix(".tmp")
        partial.write_text(f"{self._step} {self._progress}\n")
        os.replace(partial, target)  # the watchdog never reads half a record


@dataclass(frozen=True)
class Hang:
    """What the watchdog found: for the log line and the exit."""

    silent_s: float
    bound_s: float
    steps: dict[int, int]  # rank -> last finished step (-1: none in this run)
    first: list[int]  # the ranks that stopped first
    node: str

    def sentence(self) -> str:
        ranks = ", ".join(str(rank) for rank in self.first)
        last = min(self.steps.values())
        done = f"after step {last}" if last >= 0 else "before its first step"
        return (
            f"hang: no rank finished a step (or a part of a checkpoint save) for "
            f"{self.silent_s:.1f} s "
            f"(bound {self.bound_s:.1f} s); "
            f"rank {ranks} on node {self.node} stopped first, {done}; "
            f"ending the job with exit code {int(HANG_EXIT)} to restart from the last "
            "committed checkpoint"
        )


class HangWatchdog:
    """Launcher side: a thread that watches the ranks' heartbeats (see the module doc)."""

    def __init__(
        self, folder: Path, settings: WatchdogConfig, nproc: int, first_rank: int, *, node: str
    ):
        self.folder, self.settings, self.node = folder, settings, node
        self.ranks = range(first_rank, first_rank + nproc)
        self.hang: Hang | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hang-watchdog", daemon=True)
        self._step_times: list[float] = []

    def __enter__(self) -> HangWatchdog:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def bound_s(self, started: bool) -> float:
        if not started:
            return self.settings.hang_startup_s
        step_time = statistics.median(self._step_times) if self._step_times else 0.0
        return max(self.settings.hang_floor_s, self.settings.hang_step_factor * step_time)

    def _run(self) -> None:
        last_records, last_change = None, time.monotonic()
        leader, leader_since = None, last_change  # the most steps any rank finished
        while not self._stop.wait(_POLL_S):
            records, now = self._read_records(), time.monotonic()
            steps = {rank: step for rank, (step, _) in records.items()}
            if records != last_records:  # a step, or a part of a save, finished
                top = max(steps.values())
                if leader is not None and top > leader >= 0:  # not start-up: a step time
                    step_time = (now - leader_since) / (top - leader)
                    self._step_times = [*self._step_times, step_time][-_STEP_TIMES_KEPT:]
                if top != leader:
                    leader, leader_since = top, now
                last_records, last_change = records, now
                continue
            bound = self.bound_s(started=max(steps.values()) >= 0)
            if now - last_change > bound:
                self._fire(steps, now - last_change, bound)
                return

    def steps(self) -> dict[int, int]:
        """rank -> last finished step in this run (-1: none yet, still starting)."""
        return {rank: step for rank, (step, _) in self._read_records().items()}

    def _read_records(self) -> dict[int, tuple[int, int]]:
        """rank -> (last finished step, parts of checkpoint saves finished)."""
        records = {}
        for rank in self.ranks:
            try:
                fields = _beat_file(self.folder, rank).read_text().split()
                records[rank] = (int(fields[0]), int(fields[1]) if len(fields) > 1 else 0)
            except (FileNotFoundError, IndexError, ValueError):
                records[rank] = (-1, 0)
        return records

    def _fire(self, steps: dict[int, int], silent_s: float, bound_s: float) -> None:
        stacks, loader_stacks = self._dump_stacks()
        self.hang = Hang(
            silent_s=silent_s,
            bound_s=bound_s,
            steps=steps,
            first=stopped_first(steps, stacks),
            node=self.node,
        )
        log.error("%s", self.hang.sentence())
        for rank in self.ranks:
            log.error("Python stack of rank %d:\n%s", rank, stacks.get(rank) or "(none written)")
            for pid, stack in sorted(loader_stacks.get(rank, {}).items()):
                log.error(
                    "Python stack of rank %d's data-loader worker (pid %d):\n%s",
                    rank,
                    pid,
                    stack or "(none written)",
                )
        # With their DataLoader workers and fork servers, which would outlive them holding
        # the job's output open. SIGTERM would ask for a checkpoint, which would hang too.
        for process in psutil.Process().children(recursive=True):
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()

    def _dump_stacks(self) -> tuple[dict[int, str], dict[int, dict[int, str]]]:
        """Each rank's stack, and each of its live DataLoader workers' (rank -> pid -> stack)."""
        descendants = {p.pid: p for p in psutil.Process().children(recursive=True)}
        loaders = self._loader_files(descendants)
        # The ranks, and the loader workers that registered a dump (a signal the others do
        # not handle would kill them: a fork server, say).
        signalled = list(psutil.Process().children())
        signalled += [descendants[pid] for files in loaders.values() for pid in files]
        for process in signalled:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.send_signal(STACK_SIGNAL)
        time.sleep(_STACK_WAIT_S)
        stacks = {}
        for rank in self.ranks:
            with contextlib.suppress(FileNotFoundError):
                stacks[rank] = _stack_file(self.folder, rank).read_text()
        loader_stacks = {
            rank: {pid: path.read_text() for pid, path in files.items()}
            for rank, files in loaders.items()
        }
        return stacks, loader_stacks

    def _loader_files(self, descendants: dict[int, psutil.Process]) -> dict[int, dict[int, Path]]:
        """rank -> pid -> stack file of the DataLoader workers alive under this launcher (a
        file of a worker that has exited, its pid perhaps reused since, is left alone)."""
        found: dict[int, dict[int, Path]] = {}
        for rank in self.ranks:
            for path in self.folder.glob(f"rank-{rank}.loader-*.stack"):
                pid = int(path.name.split(".loader-")[1].removesuffix(".stack"))
                if pid in descendants:
                    found.setdefault(rank, {})[pid] = path
        return found


def stopped_first(steps: dict[int, int], stacks: dict[int, str]) -> list[int]:
    """The ranks with the fewest finished steps; of those, the ones not waiting inside a
    collective when some are (the waiting ones wait for them)."""
    behind = [rank for rank, step in steps.items() if step == min(steps.values())]
    not_waiting = [rank for rank in behind if not _in_collective(stacks.get(rank, ""))]
    return not_waiting if 0 < len(not_waiting) < len(steps) else behind


def _in_collective(stack: str) -> bool:
    """Whether a thread's innermost frames are inside a collective call (faulthandler
    prints each thread most recent call first, threads separated by a blank line)."""
    for thread in stack.split("\n\n"):
        frames = [line for line in thread.splitlines() if line.strip().startswith("File ")]
        if any(code in frame for frame in frames[:6] for code in COLLECTIVE_CODE):
            return True
    return False
