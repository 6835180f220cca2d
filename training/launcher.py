"""Start one worker per local GPU (2 on a CPU-only machine) through torch's elastic launcher.

This is the process a container runs as PID 1: it forwards SIGTERM/SIGINT to the workers,
waits for them to checkpoint, and exits with their exit code (docs/contracts.md, section 3).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path

import psutil
import torch
from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

from training import startup
from training.contract import (
    CPU_WORKERS,
    DEFAULT_MASTER_PORT,
    EXIT_MEANING,
    FAILURE_PREFIX,
    HANG_EXIT,
    HEARTBEAT_DIR_ENV,
    LAUNCHER_PID_ENV,
    STOPPED_BEFORE_TRAINING,
    WORKER_MODULE,
    ExitCode,
)
from training.environment import TopologyError, TrainerEnv
from training.spec.config import WatchdogConfig
from training.watchdog import HangWatchdog

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1  # linux/prctl.h
_REASON_CHARS = 500  # a worker's error, as the launcher repeats it: one line, not a novel


@dataclass(frozen=True)
class Topology:
    nnodes: int
    node_rank: int
    nproc_per_node: int
    master_addr: str
    master_port: int

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node


def topology_from_env(env: TrainerEnv) -> Topology:
    """TRAIN_NNODES, TRAIN_NODE_RANK, TRAIN_MASTER_ADDR/PORT, TRAIN_NPROC_PER_NODE."""
    return Topology(
        nnodes=env.nnodes,
        node_rank=env.node_rank,
        nproc_per_node=env.nproc_per_node or torch.cuda.device_count() or CPU_WORKERS,
        master_addr=env.master_addr,
        master_port=env.master_port or DEFAULT_MASTER_PORT,
    )


def rendezvous_port(topo: Topology, env: TrainerEnv) -> Topology:
    """The topology with a usable rendezvous port, checked on node 0.

    A single node without TRAIN_MASTER_PORT takes a free port, so that two jobs
    on one machine never collide; several nodes keep the configured (or default)
    port, which every node must agree on. Node 0 binds the port itself, so a port
    already in use is reported here, in one line.
    """
    if topo.nnodes == 1 and env.master_port is None:
        with socket.socket() as sock:
            sock.bind(("", 0))
            return replace(topo, master_port=sock.getsockname()[1])
    if topo.node_rank == 0:
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(("", topo.master_port))
            except OSError as error:
                if error.errno != errno.EADDRINUSE:
                    raise
                raise TopologyError(
                    f"TRAIN_MASTER_PORT = {topo.master_port} is already in use on this machine "
                    "(another job's rendezvous?): stop that job or set TRAIN_MASTER_PORT to a "
                    "free port on every node"
                ) from None
    return topo


def launch_config(topo: Topology, run_id: str, log_dir: Path, **options) -> LaunchConfig:
    """torch's elastic launcher for this node's ranks: every node known in advance (a static
    rendezvous on node 0), no restarts (a failed rank ends the run: the caller decides).

    Its folders for each attempt and rank (the workers' error files) go under `log_dir`,
    which the caller removes: given none, torch makes a torchelastic_* folder in the temp
    folder for every launch and leaves it there (DefaultLogsSpecs, torch 2.13
    torch/distributed/elastic/multiprocessing/api.py)."""
    return LaunchConfig(
        min_nodes=topo.nnodes,
        max_nodes=topo.nnodes,
        nproc_per_node=topo.nproc_per_node,
        run_id=run_id,
        rdzv_backend="static",
        rdzv_endpoint=f"{topo.master_addr}:{topo.master_port}",
        rdzv_configs={"rank": topo.node_rank},
        max_restarts=0,
        monitor_interval=0.5,
        logs_specs=DefaultLogsSpecs(log_dir=str(log_dir)),
        **options,
    )


def launch(
    topo: Topology,
    worker_args: list[str],
    watchdog: WatchdogConfig,
    node: str,
    op_cache: Path | None = None,
) -> int:
    """Run `python -m training.worker <worker_args>` on every local rank; return the job's
    exit code.

    A hang (training/watchdog.py) ends the job with HANG_EXIT."""
    # Like torchrun: one OpenMP thread per worker unless told otherwise, so that N workers
    # do not oversubscribe the CPU cores.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ[LAUNCHER_PID_ENV] = str(os.getpid())
    heartbeats = Path(tempfile.mkdtemp(prefix="training-heartbeats-"))
    os.environ[HEARTBEAT_DIR_ENV] = str(heartbeats)
    hang_watch = HangWatchdog(
        heartbeats,
        watchdog,
        topo.nproc_per_node,
        first_rank=topo.node_rank * topo.nproc_per_node,
        node=node,
    )
    # SIGTERM and SIGINT stay ours (below): torch's handler would kill the workers after its
    # shutdown timeout instead of letting them checkpoint.
    config = launch_config(
        topo, "training", heartbeats / "torchelastic", signals_to_handle="SIGHUP,SIGQUIT"
    )
    _stopped_at_once.clear()

    def on_stop_signal(signum: int, frame) -> None:
        trained = max(hang_watch.steps().values(), default=-1) >= 0
        if signum == signal.SIGINT and (not trained or "SIGINT" in _forwarded):
            _stop_at_once()
        else:
            _forward_to_workers(signum, frame)

    previous = {sig: signal.signal(sig, on_stop_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        if startup.stop_requested():  # between the caller's check and the handlers above
            return stopped_before_training(startup.stop_requested())
        with hang_watch:
            elastic_launch(config, sys.executable)("-m", WORKER_MODULE, *worker_args)
    except ChildFailedError as error:
        if _stopped_at_once:
            if op_cache is not None:
                release_op_build_locks(heartbeats, op_cache)
            return _cancelled()
        if hang_watch.hang is not None:  # the watchdog said why, and killed the workers
            _say_why(hang_watch.hang.sentence())
            return HANG_EXIT
        code = _job_exit_code(
            [failure.exitcode for failure in error.failures.values()],
            stop_requested=bool(_forwarded),
        )
        lines = []
        if code == ExitCode.FAILED:
            for rank, failure in sorted(error.failures.items()):
                reason = _worker_error(heartbeats, rank)
                line = failed_worker_line(
                    rank, failure.local_rank, failure.exitcode, topo.node_rank, node, reason
                )
                log.error(line)
                # A worker that said why comes first; one that only says a peer failed, last.
                peer = reason is not None and reason.startswith(AFTER_PEER)
                lines.append((reason is None, peer, line))
        log.warning("%s (exit code %d)", EXIT_MEANING[code], code)
        if lines:
            _say_why(min(lines)[-1])
        return code
    finally:
        _stopped_at_once.clear()  # ends the killing thread, if any
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        shutil.rmtree(heartbeats, ignore_errors=True)
    return 0


def failed_worker_line(
    rank: int,
    local_rank: int,
    exit_code: int,
    node_rank: int,
    node: str,
    reason: str | None = None,
) -> str:
    """One line that names a failed worker: its rank, its node, how it ended and, when it
    said (``record_worker_error``), why.

    A worker killed by a signal (the kernel's OOM killer, a SIGKILL) prints nothing
    itself; torch reports it with a negative exit code.
    """
    where = f"rank {rank} (local rank {local_rank}) on node {node_rank} ({node})"
    why = f": {reason}" if reason else ""
    if exit_code < 0:
        try:
            name = signal.Signals(-exit_code).name
        except ValueError:  # a real-time signal has no name
            name = f"signal {-exit_code}"
        return f"{where} was killed by {name}{why}"
    return f"{where} exited with status {exit_code}{why}"


def record_worker_error(folder: Path | None, rank: int, reason: str) -> None:
    """Worker side, on its way out after an error: leave the launcher one line that says
    why (the launcher's heartbeat folder; none when started without the launcher)."""
    if folder is not None:
        with contextlib.suppress(OSError):
            _worker_error_file(folder, rank).write_text(" ".join(reason.split())[:_REASON_CHARS])


AFTER_PEER = "stopped after another rank failed: "


def peer_error(folder: Path | None, rank: int) -> str | None:
    """Worker side: why another rank of this node failed, if one said so already. A rank
    whose collective broke because a peer died (a gloo or NCCL error) then says that in one
    line, instead of a traceback that buries the cause."""
    if folder is None:
        return None
    for path in sorted(folder.glob("rank-*.error")):
        if path != _worker_error_file(folder, rank):
            with contextlib.suppress(OSError):
                return path.read_text().strip() or None
    return None


def _worker_error(folder: Path, rank: int) -> str | None:
    try:
        return _worker_error_file(folder, rank).read_text().strip() or None
    except OSError:
        return None


def _worker_error_file(folder: Path, rank: int) -> Path:
    return folder / f"rank-{rank}.error"


def _say_why(reason: str) -> None:
    """The launcher's last line when the job ended badly: whoever started it (a person, the
    node's job watcher) reads why there."""
    print(f"{FAILURE_PREFIX}{reason}", file=sys.stderr, flush=True)


def stopped_before_training(signal_name: str | None) -> int:
    """A stop request before any worker started: Ctrl-C ends the run (130), SIGTERM (a
    spot notice, `docker stop`) asks for a restart (75); nothing trained either way."""
    if signal_name == "SIGINT":
        return _cancelled()
    log.warning("received %s: %s (exit code 75)", signal_name, STOPPED_BEFORE_TRAINING)
    return ExitCode.INTERRUPTED


def _cancelled() -> int:
    log.warning("received SIGINT: %s (exit code 130)", EXIT_MEANING[ExitCode.CANCELLED])
    return ExitCode.CANCELLED


_forwarded: list[str] = []  # the stop signals passed on to the workers
_stopped_at_once: list[bool] = []  # a Ctrl-C that killed the workers instead


def _stop_at_once() -> None:
    """Ctrl-C before the first step (nothing worth a checkpoint yet) or a second Ctrl-C:
    kill every worker and its data loaders now, without a checkpoint. torch's agent may
    still be starting workers (and, once one died, SIGTERMs the rest and waits 30 s for
    them): every process it starts from here on is killed too, until launch() returns."""
    first = not _stopped_at_once
    _stopped_at_once.append(True)  # before the thread starts: it runs while this is set
    if first:
        log.warning("received SIGINT: stopping the workers at once")
        threading.Thread(target=_keep_killing_workers, name="stop-at-once", daemon=True).start()


def release_op_build_locks(marks: Path, op_cache: Path) -> None:
    """Remove the build locks of the ops killed workers were loading. torch's build lock
    (torch/utils/file_baton.py, FileBaton: a `lock` file in the op's build folder) is
    waited on forever by the next start when its holder died, so a Ctrl-C during a first
    start would otherwise hang every later one on this machine."""
    for mark in marks.glob(f"rank-*{startup.OP_BUILD_MARK}"):
        name = mark.read_text().strip()
        for lock in [*op_cache.glob(f"{name}/lock"), *op_cache.glob(f"*/{name}/lock")]:
            log.warning("removing %s, left by a worker stopped while it built", lock)
            lock.unlink(missing_ok=True)


def _keep_killing_workers() -> None:
    while _stopped_at_once:
        for process in psutil.Process().children(recursive=True):
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
        time.sleep(0.05)


def _forward_to_workers(signum: int, _frame) -> None:
    """Pass the signal on; the workers' stop flag checkpoints and they exit with 75."""
    _forwarded.append(signal.Signals(signum).name)
    workers = psutil.Process().children(recursive=False)
    log.warning(
        "received %s: asking %d worker(s) to checkpoint and stop",
        signal.Signals(signum).name,
        len(workers),
    )
    for worker in workers:
        with contextlib.suppress(psutil.NoSuchProcess):  # it exited meanwhile
            worker.send_signal(signum)


def _job_exit_code(exit_codes: list[int], *, stop_requested: bool = False) -> int:
    """One code for the job from the failed workers' codes.

    75 from any rank means the collective checkpoint was written; ranks the launcher
    stopped meanwhile (negative: killed by a signal) do not change that. After a stop
    request passed on to the workers, ranks killed by it before they listened (still
    starting) count as stopped too: nothing had trained, nothing is lost.
    """
    if ExitCode.BAD_CONFIG in exit_codes:
        return ExitCode.BAD_CONFIG
    stopped = [code == ExitCode.INTERRUPTED or code < 0 for code in exit_codes]
    if all(stopped) and (stop_requested or ExitCode.INTERRUPTED in exit_codes):
        return ExitCode.INTERRUPTED
    return ExitCode.FAILED


def die_with_launcher(env: TrainerEnv) -> None:
    """Worker side: be killed the moment the launcher dies, however it died.

    torch's elastic agent starts workers in their own sessions, so a launcher
    killed alone (SIGKILL, OOM) would leave them training, racing the next run
    for the same checkpoint folder. The kernel's parent-death signal
    (prctl(2) PR_SET_PDEATHSIG, Linux) kills them instead; a checkpoint cut short
    that way is never committed, so the next run resumes from the last one.
    """
    launcher = env.launcher_pid
    if launcher is None or not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        log.warning("cannot ask to die with the launcher: %s", os.strerror(ctypes.get_errno()))
        return
    if os.getppid() != launcher:  # it died before the request took effect
        os.kill(os.getpid(), signal.SIGKILL)
