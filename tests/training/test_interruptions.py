"""End to end: `python -m training` (launcher + 2 ranks) stopped by SIGTERM or a spot notice.

Each run is a real launcher subprocess with real gloo ranks. A stop must give
exit code 75 and a committed checkpoint at the step the ranks stopped after,
and running the same command again must continue from that step. (That the
resumed run equals an uninterrupted one is tests/training/test_resume.py.)
"""

from __future__ import annotations

import datetime
import json
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.training.fake_imds import FakeImds
from tests.training.multirank import free_port, launch_env
from training.checkpoint.layout import COMMIT_MARKER, POINTER_NAME, parse_step, tag_for
from training.checkpoint.s3 import STATUS_NAME, S3Mirror
from training.contract import ExitCode

pytestmark = pytest.mark.multiprocess

LONG_RUN = 100_000  # steps: the run only ends through the stop request
OPTIONS = [
    "--set", "checkpoint.every_steps=1000000",  # only the stop writes a checkpoint
    "--set", "logging.every_steps=2",
    "--set", "logging.progress_bar=false",
    "--set", "logging.tensorboard=false",
]  # fmt: skip


def start(work: Path, steps: int, env: dict[str, str]) -> subprocess.Popen:
    """`python -m training` in ``work`` (checkpoints in work/ckpt), output to a log file."""
    env = launch_env(
        TRAIN_CHECKPOINT_DIR=str(work / "ckpt"),
        TRAIN_OUTPUT_DIR=str(work / "out"),
        TRAIN_NPROC_PER_NODE="2",
        TRAIN_MASTER_PORT=str(free_port()),
        **{"TRAIN_SPOT_ENDPOINT": "", **env},
    )
    command = [sys.executable, "-m", "training", "--set", f"train.steps={steps}", *OPTIONS]
    log = open(work / f"log-{steps}.txt", "w")  # noqa: SIM115 (closed with the process)
    return subprocess.Popen(
        command, env=env, cwd=work, stdout=log, stderr=subprocess.STDOUT, text=True
    )


def wait_for_progress(work: Path, job: subprocess.Popen, timeout_s: float = 120) -> None:
    """Until rank 0 has written a metrics record (the ranks are training)."""
    metrics = work / "out" / "metrics.jsonl"
    deadline = time.monotonic() + timeout_s
    while not (metrics.exists() and metrics.read_text().strip()):
        assert job.poll() is None, (work / f"log-{LONG_RUN}.txt").read_text()[-3000:]
        assert time.monotonic() < deadline, "no training progress"
        time.sleep(0.1)


def interrupted_run(work: Path, trigger, env: dict[str, str]) -> tuple[int, str]:
    """Start a long run, trigger a stop once it trains; returns (stop step, log)."""
    job = start(work, LONG_RUN, env)
    try:
        wait_for_progress(work, job)
        trigger(job)
        code = job.wait(timeout=120)
    finally:
        if job.poll() is None:
            job.kill()
    log = (work / f"log-{LONG_RUN}.txt").read_text()
    assert code == ExitCode.INTERRUPTED, log[-3000:]
    stopped = re.findall(r"stopped at step (\d+) \((.*?)\); checkpoint saved", log)
    assert len(stopped) == 2, log[-3000:]  # both ranks, at the same step
    assert stopped[0][0] == stopped[1][0]
    step = int(stopped[0][0])
    assert 0 < step < LONG_RUN
    assert committed_steps(work / "ckpt") == [step]
    assert (work / "ckpt" / POINTER_NAME).read_text().strip() == tag_for(step)
    return step, log


def resumed_run(work: Path, stop_step: int, env: dict[str, str]) -> str:
    """Run the same command again: it must continue from the stop and commit the end."""
    total = stop_step + 4
    job = start(work, total, env)
    code = job.wait(timeout=180)
    log = (work / f"log-{total}.txt").read_text()
    assert code == 0, log[-3000:]
    assert f"resumed from {work / 'ckpt' / tag_for(stop_step)} at step {stop_step}" in log
    records = [json.loads(line) for line in (work / "out" / "metrics.jsonl").open()]
    after = [r["step"] for r in records if r["step"] > stop_step]
    assert after and after[-1] == total
    assert committed_steps(work / "ckpt")[-1] == total
    return log


def committed_steps(root: Path) -> list[int]:
    return sorted(
        parse_step(p.parent.name) for p in root.glob(f"step_*/{COMMIT_MARKER}") if p.is_file()
    )


def test_sigterm_checkpoints_exits_75_and_resumes(tmp_path):
    step, log = interrupted_run(tmp_path, lambda job: job.send_signal(signal.SIGTERM), env={})
    assert "(SIGTERM)" in log
    resumed_run(tmp_path, step, env={})


def test_spot_notice_checkpoints_to_s3_and_a_new_instance_resumes(tmp_path, s3_uri):
    """The notice stops the run with the checkpoint in S3; a fresh disk resumes from there."""
    notice = "2026-11-30T12:02:00Z"
    launched = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
    with FakeImds() as imds:
        env = {"TRAIN_SPOT_ENDPOINT": imds.url, "TRAIN_S3_URI": s3_uri}
        step, log = interrupted_run(tmp_path, lambda job: imds.notify("terminate", notice), env=env)
    assert f"spot interruption: terminate at {notice}" in log
    mirror = S3Mirror.from_uri(s3_uri)
    assert mirror.latest_tag() == tag_for(step)
    # The job's progress sits beside the checkpoints, where `python -m infra status` reads it.
    status = read_status(mirror)
    assert (status["state"], status["step"]) == ("interrupted", step)
    assert status["loss"] > 0 and status["tokens_per_s"] > 0
    # When the job ran, for `status` and `jobs` to read its spend from the spend guard's ledger.
    [(began, counted)] = spans(status)
    # (The launcher's process start time, as the kernel tells it: within a second or two.)
    slack = datetime.timedelta(seconds=2)
    assert launched - slack <= began < counted <= datetime.datetime.now(datetime.UTC)

    shutil.rmtree(tmp_path / "ckpt")  # the replacement instance starts with an empty disk
    log = resumed_run(tmp_path, step, env={"TRAIN_S3_URI": s3_uri})
    assert f"fetching {tag_for(step)} from {s3_uri}" in log
    status = read_status(mirror)
    assert (status["state"], status["step"], status["seconds_left"]) == ("done", step + 4, 0)
    assert status["total_steps"] == step + 4
    first, second = spans(status)  # the first start as it was, then the one that resumed
    assert first[0] == began and first[1] >= counted and second[0] >= first[1] - slack


def spans(status: dict) -> list[tuple[datetime.datetime, datetime.datetime]]:
    return [tuple(map(datetime.datetime.fromisoformat, span)) for span in status["run_spans"]]


def read_status(mirror: S3Mirror) -> dict:
    body = mirror._s3.get_object(Bucket=mirror.bucket, Key=f"{mirror.prefix}/{STATUS_NAME}")
    return json.loads(body["Body"].read())


@pytest.mark.slow(reason="a real launcher and 2 ranks stopped while they start", seconds=40)
def test_ctrl_c_during_start_up_stops_at_once_with_130_and_trains_nothing(tmp_path):
    job = start(tmp_path, LONG_RUN, env={})
    log_file = tmp_path / f"log-{LONG_RUN}.txt"
    try:
        deadline = time.monotonic() + 120
        while "start-up: launch" not in log_file.read_text():  # the workers are starting
            assert job.poll() is None and time.monotonic() < deadline, log_file.read_text()
            time.sleep(0.05)
        job.send_signal(signal.SIGINT)
        asked = time.monotonic()
        code = job.wait(timeout=60)
        waited = time.monotonic() - asked
    finally:
        if job.poll() is None:
            job.kill()
    log = log_file.read_text()
    assert code == ExitCode.CANCELLED == 130, log[-3000:]
    assert waited < 10, log[-3000:]  # at once: no step, no checkpoint written first
    assert "received SIGINT" in log and "Traceback" not in log
    assert not (tmp_path / "out" / "metrics.jsonl").exists()
    assert committed_steps(tmp_path / "ckpt") == []


def test_a_stop_before_the_workers_start_is_130_for_ctrl_c_and_75_for_sigterm():
    from training.launcher import stopped_before_training

    assert stopped_before_training("SIGINT") == ExitCode.CANCELLED
    assert stopped_before_training("SIGTERM") == ExitCode.INTERRUPTED
