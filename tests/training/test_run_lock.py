"""One launcher per run folder: a second one is refused in one line before any rank starts,
and a launcher that dies, however it dies, leaves no lock behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.training.jobs import TINY, read_metrics, run_job, start_job
from training.run_lock import RunFolderBusy, RunFolderLock, run_folders
from training.spec.config import load_config

HOLD = """
import sys, time
from pathlib import Path
from training.run_lock import RunFolderLock
lock = RunFolderLock(node_rank=0)
lock.acquire([Path(sys.argv[1])])
print("held", flush=True)
time.sleep(600)
"""


def test_a_held_folder_is_refused_naming_the_holder_and_free_once_released(tmp_path):
    first = RunFolderLock(node_rank=0)
    first.acquire([tmp_path / "run", tmp_path / "ckpt"])
    with pytest.raises(RunFolderBusy) as refused:
        RunFolderLock(node_rank=0).acquire([tmp_path / "run"])
    message = str(refused.value)
    assert message.startswith(
        f"{tmp_path / 'run'} is in use by another launcher (pid {os.getpid()} "
    )
    assert "give this run its own run.name" in message
    # The checkpoint folder alone is the same run: refused too.
    with pytest.raises(RunFolderBusy, match="ckpt is in use"):
        RunFolderLock(node_rank=0).acquire([tmp_path / "elsewhere", tmp_path / "ckpt"])
    first.release()
    RunFolderLock(node_rank=0).acquire([tmp_path / "run", tmp_path / "ckpt"])


def test_a_run_of_its_own_on_the_first_ones_checkpoint_folder_is_refused(tmp_path):
    """The checkpoints are what two launchers would race for: a second run folder that names
    the first run's checkpoint folder (inside the first's run folder) is the same run."""
    first = load_config(None, [f"run.output_dir={tmp_path / 'a'}"])
    second = load_config(
        None, [f"run.output_dir={tmp_path / 'b'}", f"checkpoint.dir={first.checkpoint_dir}"]
    )
    held = RunFolderLock(node_rank=0)
    held.acquire(run_folders(first))
    with pytest.raises(RunFolderBusy, match=f"{first.checkpoint_dir} is in use"):
        RunFolderLock(node_rank=0).acquire(run_folders(second))


def test_another_node_rank_of_the_same_run_is_not_a_second_launcher(tmp_path):
    """The nodes of one job may share the run folder (a shared filesystem, or two simulated
    nodes on one machine): each node's launcher holds its own lock."""
    RunFolderLock(node_rank=0).acquire([tmp_path])
    RunFolderLock(node_rank=1).acquire([tmp_path])


def test_a_launcher_killed_outright_leaves_no_lock_behind(tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline() == "held\n"
        with pytest.raises(RunFolderBusy, match=f"pid {holder.pid} "):
            RunFolderLock(node_rank=0).acquire([tmp_path])
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
    finally:
        holder.kill()
    RunFolderLock(node_rank=0).acquire([tmp_path])  # the kernel let go of it with the process


@pytest.mark.multiprocess
@pytest.mark.slow(
    reason="a real 2-rank job kept running while a second launcher is refused", seconds=70
)
def test_a_second_launcher_on_a_running_job_is_refused_and_the_first_goes_on(tmp_path):
    job = (*TINY, "train.steps=400", "checkpoint.every_steps=400")
    first = start_job(tmp_path, *job)
    try:
        deadline = time.monotonic() + 180
        while not read_metrics(tmp_path):
            assert first.poll() is None, first.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "the first job never trained a step"
            time.sleep(0.1)

        second = run_job(tmp_path, *job, timeout=120)
        assert second.returncode == 2, second.stderr[-3000:]
        (line,) = second.stderr.splitlines()
        assert line.startswith(f"error: {tmp_path} is in use by another launcher (pid {first.pid} ")

        assert first.poll() is None  # untouched: it trains on, and stops when asked
        first.send_signal(signal.SIGTERM)
        _, stderr = first.communicate(timeout=120)
    finally:
        first.kill()
    assert first.returncode == 75, stderr[-3000:]
    stopped_at = read_metrics(tmp_path)[-1]["step"]
    assert (tmp_path / "checkpoints" / f"step_{stopped_at:08d}" / "commit.json").is_file()
