"""SIGTERM at the earliest moments of a job ends in 75 (docs/contracts.md), never -15 or 1."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import psutil
import pytest

from tests.training.jobs import TINY, start_job

pytestmark = pytest.mark.multiprocess


def catches(pid: int, sig: signal.Signals) -> bool:
    """Whether process ``pid`` has a handler for ``sig`` (the SigCgt mask of proc(5))."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    mask = next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:"))
    return bool(int(mask, 16) & (1 << (sig - 1)))


def wait_for(condition, what: str, process, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert process.poll() is None, f"exited before {what}: {process.communicate()[1][-3000:]}"
        assert time.monotonic() < deadline, f"never saw {what}"
        time.sleep(0.005)


def test_sigterm_before_any_worker_exists_exits_75(tmp_path):
    """Injects: SIGTERM to the launcher as soon as it listens, while it still imports torch
    and checks the config. Proves: exit 75 with "stopped before training started" and
    no worker ever started (before the fix: -15)."""
    job = start_job(tmp_path, *TINY)
    wait_for(lambda: catches(job.pid, signal.SIGTERM), "a SIGTERM handler", job)
    assert not psutil.Process(job.pid).children()
    job.send_signal(signal.SIGTERM)
    _, stderr = job.communicate(timeout=120)
    assert job.returncode == 75, stderr[-3000:]
    assert "stopped before training started" in stderr
    assert "starting 2 worker(s)" not in stderr and "[rank 0]" not in stderr
    # Nothing checkpointed (the launcher may have made the folder it holds its lock in).
    assert not list((tmp_path / "checkpoints").glob("step_*"))


def test_sigterm_while_workers_start_exits_75(tmp_path):
    """Injects: SIGTERM to the launcher the moment its first worker process exists (the
    workers are still starting Python). Proves: exit 75, no traceback (before the fix: 1
    with "see its traceback above" and no traceback)."""
    job = start_job(tmp_path, *TINY)
    wait_for(lambda: psutil.Process(job.pid).children(), "a worker process", job)
    job.send_signal(signal.SIGTERM)
    _, stderr = job.communicate(timeout=180)
    assert job.returncode == 75, stderr[-3000:]
    assert "Traceback" not in stderr
