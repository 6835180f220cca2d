"""The launcher killed alone takes its workers with it (real ranks)."""

from __future__ import annotations

import contextlib
import signal
import time

import psutil
import pytest

from tests.training.jobs import TINY, read_metrics, start_job

pytestmark = pytest.mark.multiprocess


def running(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE  # a zombie has exited
    except psutil.NoSuchProcess:
        return False


def test_workers_die_within_5_s_of_a_killed_launcher(tmp_path):
    """Injects: SIGKILL to the launcher process only, while both ranks train. Proves: no
    worker is alive 5 s later, so none can write into a folder a new run is using."""
    launcher = start_job(tmp_path, *TINY, "train.steps=100000")
    workers: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 180
        while not read_metrics(tmp_path):
            assert launcher.poll() is None, launcher.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "the job never logged a step"
            time.sleep(0.1)
        workers = psutil.Process(launcher.pid).children(recursive=True)
        assert len(workers) == 2, workers
        launcher.send_signal(signal.SIGKILL)
        launcher.wait(timeout=10)
        _, alive = psutil.wait_procs(workers, timeout=5)
        alive = [w for w in alive if running(w)]
        assert not alive, f"workers still running after the launcher died: {alive}"
    finally:
        launcher.kill()
        for worker in workers:  # orphans if the test failed: they are no children of ours
            with contextlib.suppress(psutil.NoSuchProcess):
                worker.kill()
