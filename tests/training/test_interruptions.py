"""End to end: `python -m training` (launcher + 2 ranks) stopped by SIGTERM or a spot notice.

Each run is a real launcher subprocess with real gloo ranks. A stop must give
exit code 75 and a committed checkpoint at the step the ranks stopped after,
and running the same command again must continue from that step and end with
the same weights as a run that was never interrupted.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.training.fake_imds import FakeImds
from tests.training.multirank import REPO_ROOT, free_port, launch_env
from training.checkpoint import COMMIT_MARKER, POINTER_NAME, parse_step, tag_for

pytestmark = pytest.mark.slow

EXIT_INTERRUPTED = 75
LONG_RUN = 100_000  # steps: the run only ends through the stop request
OPTIONS = [
    "--set", "checkpoint.every_steps=1000000",  # only the stop writes a checkpoint
    "--set", "logging.every_steps=2",
    "--set", "logging.progress_bar=false",
    "--set", "logging.tensorboard=false",
]  # fmt: skip


def start(work: Path, steps: int, spot_endpoint: str = "") -> subprocess.Popen:
    env = launch_env(
        TRAIN_CHECKPOINT_DIR=str(work / "ckpt"),
        TRAIN_OUTPUT_DIR=str(work / "out"),
        TRAIN_NPROC_PER_NODE="2",
        TRAIN_MASTER_PORT=str(free_port()),
        TRAIN_SPOT_ENDPOINT=spot_endpoint,
    )
    command = [sys.executable, "-m", "training", "--set", f"train.steps={steps}", *OPTIONS]
    log = open(work / f"log-{steps}.txt", "w")  # noqa: SIM115 (closed with the process)
    return subprocess.Popen(
        command, env=env, cwd=work, stdout=log, stderr=subprocess.STDOUT, text=True
    )


def run_to_end(work: Path, steps: int) -> str:
    job = start(work, steps)
    code = job.wait(timeout=180)
    log = (work / f"log-{steps}.txt").read_text()
    assert code == 0, log[-3000:]
    return log


def wait_for_progress(work: Path, job: subprocess.Popen, timeout_s: float = 120) -> None:
    """Until rank 0 has written a metrics record (the ranks are training)."""
    metrics = work / "out" / "metrics.jsonl"
    deadline = time.monotonic() + timeout_s
    while not (metrics.exists() and metrics.read_text().strip()):
        assert job.poll() is None, (work / f"log-{LONG_RUN}.txt").read_text()[-3000:]
        assert time.monotonic() < deadline, "no training progress"
        time.sleep(0.1)


def interrupted_run(work: Path, trigger, spot_endpoint: str = "") -> tuple[int, str]:
    """Start a long run, trigger a stop once it trains, return (stop step, log)."""
    job = start(work, LONG_RUN, spot_endpoint)
    try:
        wait_for_progress(work, job)
        trigger(job)
        code = job.wait(timeout=120)
    finally:
        if job.poll() is None:
            job.kill()
    log = (work / f"log-{LONG_RUN}.txt").read_text()
    assert code == EXIT_INTERRUPTED, log[-3000:]
    stopped = re.findall(r"stopped at step (\d+) \((.*?)\); checkpoint saved", log)
    assert len(stopped) == 2, log[-3000:]  # both ranks, at the same step
    assert stopped[0][0] == stopped[1][0]
    step = int(stopped[0][0])
    assert 0 < step < LONG_RUN
    return step, log


def committed_steps(root: Path) -> list[int]:
    return sorted(
        parse_step(p.parent.name) for p in root.glob(f"step_*/{COMMIT_MARKER}") if p.is_file()
    )


def exported_weights(work: Path, steps: int) -> dict[str, torch.Tensor]:
    out = work / f"weights-{steps}.pt"
    subprocess.run(
        [sys.executable, "-m", "training", "export", str(work / "ckpt" / tag_for(steps)), str(out)],
        env=launch_env(),
        cwd=REPO_ROOT,
        check=True,
        capture_output=True,
    )
    return torch.load(out)


def check_resume(work: Path, stop_step: int, *, compare_with: Path | None = None) -> None:
    """Running again continues from the stop, and ends with the same weights as a run
    that was never interrupted (made in ``compare_with``)."""
    assert committed_steps(work / "ckpt") == [stop_step]
    assert (work / "ckpt" / POINTER_NAME).read_text().strip() == tag_for(stop_step)

    total = stop_step + 4
    log = run_to_end(work, total)
    assert f"resumed from {work / 'ckpt' / tag_for(stop_step)} at step {stop_step}" in log
    records = [json.loads(line) for line in (work / "out" / "metrics.jsonl").open()]
    after = [r["step"] for r in records if r["step"] > stop_step]
    assert after and after[-1] == total
    assert committed_steps(work / "ckpt") == [stop_step, total]

    if compare_with is not None:
        compare_with.mkdir()
        run_to_end(compare_with, total)
        resumed, uninterrupted = (
            exported_weights(work, total),
            exported_weights(compare_with, total),
        )
        assert resumed.keys() == uninterrupted.keys()
        for name in resumed:
            assert torch.equal(resumed[name], uninterrupted[name]), name


def test_sigterm_checkpoints_exits_75_and_resumes(tmp_path):
    work = tmp_path / "run"
    work.mkdir()
    step, log = interrupted_run(work, trigger=lambda job: job.send_signal(signal.SIGTERM))
    assert "(SIGTERM)" in log
    check_resume(work, step, compare_with=tmp_path / "uninterrupted")


def test_spot_notice_checkpoints_exits_75_and_resumes(tmp_path):
    work = tmp_path / "run"
    work.mkdir()
    with FakeImds() as imds:
        notice = "2026-11-30T12:02:00Z"
        step, log = interrupted_run(
            work,
            trigger=lambda job: imds.notify("terminate", notice),
            spot_endpoint=imds.url,
        )
    assert f"spot interruption: terminate at {notice}" in log
    check_resume(work, step)
