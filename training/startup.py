"""Stop requests that arrive before anything else listens for them.

`python -m training` installs these handlers first, before torch is imported,
so that a SIGTERM or SIGINT during the seconds of start-up is remembered
instead of killing the process with -15: the launcher then exits 75 before
starting workers, and a worker hands the request to its StopFlag.
Torch-free on purpose: it must be importable in milliseconds.
"""

from __future__ import annotations

import gc
import os
import signal
import sys
import time
from pathlib import Path

OP_BUILD_MARK = ".op-build"

_received: list[str] = []


def listen() -> None:
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _remember)


def stop_requested() -> str | None:
    """The name of the first stop signal received since listen(), or None."""
    return _received[0] if _received else None


def _remember(signum: int, _frame) -> None:
    _received.append(signal.Signals(signum).name)


# ------------------------------------------------------------------ garbage collection
# Importing torch, DeepSpeed and the trainer makes a few hundred thousand objects that live
# as long as the process. With the collector on, each full collection on the way rescans all
# of them: a fifth of a process's import time (measured: 2.6 s of CPU with it, 2.1 s
# without). Megatron-LM turns automatic collection off in training for the same cost (its
# --manual-gc).


def hold_collection() -> None:
    """No cyclic garbage collection until release_collection(): call it before the imports."""
    gc.disable()


def release_collection() -> None:
    """The imports are done: what they made is set aside for good (gc.freeze: later
    collections never rescan it) and collection runs again for what training makes."""
    gc.freeze()
    gc.enable()


# ------------------------------------------------------------------ phases
# A start-up of tens of seconds (a first start compiles DeepSpeed ops for a minute) says
# what it is doing: one line as each phase begins, from the launcher and rank 0. The
# goodput report (training.goodput) reads the same marks.

STARTUP_PHASES = ("launch", "imports", "rendezvous", "engine build", "op build", "checkpoint load")
_began: list[tuple[str, float]] = []
_op_builds: list[tuple[float, float]] = []
# Who says the lines ("launcher", "rank 0"; None: this rank is quiet), and the launcher's
# process id in a worker: set by the entry points (training/__main__.py, training/worker.py).
_speaker: str | None = "launcher"
_launcher_pid: int | None = None


def speak_as_worker(rank: int, launcher_pid: int | None) -> None:
    """This process is worker `rank`, started by the launcher with `launcher_pid`."""
    global _speaker, _launcher_pid
    _speaker = "rank 0" if rank == 0 else None
    _launcher_pid = launcher_pid


def begin(phase: str, doing: str) -> None:
    """Note that ``phase`` (one of STARTUP_PHASES) begins now, and say what it does."""
    _began.append((phase, time.time()))
    _say(f"start-up: {phase}: {doing}")


def watch_op_builds(marks: Path | None = None, rank: int = 0) -> None:
    """Say when DeepSpeed loads a JIT op (compiled on a machine's first start, then
    cached), and time it: it happens inside the rendezvous or the engine build. While it
    loads, `marks/rank-<rank>.op-build` names the op: a worker killed meanwhile (Ctrl-C
    during start-up) leaves torch's build lock behind, which the launcher then removes
    (training/launcher.py, release_op_build_locks)."""
    from training.private_apis import on_op_build  # DeepSpeed's import is part of the timing

    mark = marks / f"rank-{rank}{OP_BUILD_MARK}" if marks is not None else None

    def began(name: str) -> None:
        _say(
            f"start-up: op build: DeepSpeed op {name} (compiled on this machine's "
            "first start, a minute or more; loaded from the cache after)"
        )
        if mark is not None:
            mark.write_text(name)

    def ended(start: float, end: float) -> None:
        _op_builds.append((start, end))
        if mark is not None:
            mark.unlink(missing_ok=True)

    on_op_build(began, ended)


def launched_at() -> float:
    """When the launcher started (Unix time): the start of the whole attempt."""
    import psutil

    try:
        return psutil.Process(_launcher_pid or os.getpid()).create_time()
    except psutil.Error:
        return psutil.Process().create_time()


def phase_durations(*, until: float) -> dict[str, float]:
    """Seconds of each start-up phase of this worker, up to ``until`` (Unix time).

    Launch runs from the launcher's start to this process's; imports from there to
    the next phase noted; each phase then lasts until the next begins. Op builds are
    taken out of the phase they happened in.
    """
    import psutil

    marks = [("launch", launched_at()), ("imports", psutil.Process().create_time())]
    marks += [(phase, at) for phase, at in _began if phase not in ("launch", "imports")]
    durations = dict.fromkeys(STARTUP_PHASES, 0.0)
    for (phase, began), (_, ended) in zip(marks, [*marks[1:], ("", until)], strict=True):
        ops = sum(max(0.0, min(e, ended) - max(b, began)) for b, e in _op_builds)
        durations[phase] += ended - began - ops
        durations["op build"] += ops
    return durations


def _say(line: str) -> None:
    if _speaker is not None:
        print(f"{time.strftime('%H:%M:%S')} [{_speaker}] {line}", file=sys.stderr, flush=True)
