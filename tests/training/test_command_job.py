"""`python -m training exec -- COMMAND`: the command gets the rendezvous and the job's paths,
a stop reaches it as SIGTERM, and its exit 75 is the job's; examples/command_job.py saves on
SIGTERM and resumes from its own checkpoint; a real torchrun stopped by a spot notice
resumes on another node from the copy of its CHECKPOINT_DIR in moto's S3."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.training.fake_imds import FakeImds
from tests.training.multirank import free_port
from training.contract import ExitCode

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "command_job.py"
TORCHRUN_JOB = Path(__file__).with_name("torchrun_job.py")


def job_env(tmp_path: Path) -> dict[str, str]:
    return {
        **os.environ,
        "TRAIN_NNODES": "2",
        "TRAIN_NODE_RANK": "1",
        "TRAIN_NPROC_PER_NODE": "4",
        "TRAIN_MASTER_ADDR": "10.0.0.7",
        "TRAIN_MASTER_PORT": "29611",
        "TRAIN_CHECKPOINT_DIR": str(tmp_path / "ckpt"),
        "TRAIN_DATA_PATH": str(tmp_path / "data"),
    }


def exec_job(tmp_path: Path, *command: str, spot: str = "") -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "training", "exec", "--", *command],
        env={**job_env(tmp_path), "TRAIN_SPOT_ENDPOINT": spot},
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )


def test_the_command_sees_the_rendezvous_and_the_jobs_paths(tmp_path):
    names = ["MASTER_ADDR", "MASTER_PORT", "NNODES", "NODE_RANK", "WORLD_SIZE"]
    names += ["PET_NNODES", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT"]
    names += ["PET_NPROC_PER_NODE", "CHECKPOINT_DIR", "DATA_PATH"]
    probe = f"import json, os; print(json.dumps({{n: os.environ[n] for n in {names!r}}}))"
    job = exec_job(tmp_path, sys.executable, "-c", probe)
    out, _ = job.communicate(timeout=60)
    assert job.returncode == 0
    assert json.loads(out) == {
        "MASTER_ADDR": "10.0.0.7",
        "MASTER_PORT": "29611",
        "NNODES": "2",
        "NODE_RANK": "1",
        "WORLD_SIZE": "8",  # 2 nodes x 4 processes
        "PET_NNODES": "2",
        "PET_NODE_RANK": "1",
        "PET_MASTER_ADDR": "10.0.0.7",
        "PET_MASTER_PORT": "29611",
        "PET_NPROC_PER_NODE": "4",
        "CHECKPOINT_DIR": str(tmp_path / "ckpt"),
        "DATA_PATH": str(tmp_path / "data"),
    }
    assert (tmp_path / "ckpt").is_dir()  # made for the command to save into


def wait_for_step(state: Path, job: subprocess.Popen, step: int) -> None:
    deadline = time.monotonic() + 30
    while not (state.exists() and json.loads(state.read_text())["step"] >= step):
        assert time.monotonic() < deadline and job.poll() is None
        time.sleep(0.1)


def test_a_stop_reaches_the_command_which_saves_exits_75_and_resumes(tmp_path):
    state = tmp_path / "ckpt" / "state.json"
    job = exec_job(tmp_path, sys.executable, str(EXAMPLE), "--steps", "1000")
    wait_for_step(state, job, 3)
    job.send_signal(signal.SIGTERM)  # what docker stop and scancel send
    out, _ = job.communicate(timeout=30)
    assert job.returncode == ExitCode.INTERRUPTED, out
    saved = json.loads(state.read_text())["step"]
    assert f"saved at step {saved}" in out
    again = exec_job(tmp_path, sys.executable, str(EXAMPLE), "--steps", str(saved + 2))
    out, _ = again.communicate(timeout=30)
    assert again.returncode == ExitCode.DONE
    assert f"from step {saved}" in out and f"done at step {saved + 2}" in out


def test_without_a_command_exec_says_how_to_give_one(tmp_path):
    job = exec_job(tmp_path)
    out, _ = job.communicate(timeout=30)
    assert job.returncode == ExitCode.BAD_CONFIG
    assert out.strip() == "error: exec: give the command after --, e.g. exec -- torchrun train.py"


def test_a_checkpoint_folder_that_cannot_be_made_is_one_line_before_the_command(tmp_path):
    (tmp_path / "file").write_text("")
    job = subprocess.run(
        [sys.executable, "-m", "training", "exec", "--", sys.executable, "-c", "print('ran')"],
        env={**os.environ, "TRAIN_CHECKPOINT_DIR": str(tmp_path / "file" / "ckpt")},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert job.returncode == ExitCode.BAD_CONFIG
    assert job.stderr.startswith("error: ") and "TRAIN_CHECKPOINT_DIR" in job.stderr
    assert len(job.stderr.strip().splitlines()) == 1 and "ran" not in job.stdout


def test_a_spot_notice_reaches_the_command_as_sigterm(tmp_path):
    state = tmp_path / "ckpt" / "state.json"
    with FakeImds() as imds:
        job = exec_job(tmp_path, sys.executable, str(EXAMPLE), "--steps", "1000", spot=imds.url)
        wait_for_step(state, job, 3)
        imds.notify("stop", "2026-01-01T00:02:00Z")
        out, _ = job.communicate(timeout=30)
    assert job.returncode == ExitCode.INTERRUPTED, out
    assert f"saved at step {json.loads(state.read_text())['step']}" in out


@pytest.mark.multiprocess
def test_a_torchrun_job_stopped_by_a_spot_notice_resumes_on_another_node_from_s3(
    tmp_path, s3_uri, ci_log
):
    def torchrun(disk: Path, steps: int, spot: str) -> subprocess.Popen:
        """torchrun (its module, in this interpreter) with 2 ranks, as `run STACK --
        torchrun --nproc-per-node 2 ...` starts it on a node whose disk is `disk`."""
        env = {
            **os.environ,
            "TRAIN_NPROC_PER_NODE": "2",
            "TRAIN_MASTER_PORT": str(free_port()),
            "TRAIN_CHECKPOINT_DIR": str(disk / "ckpt"),
            "TRAIN_S3_URI": s3_uri,
            "TRAIN_SPOT_ENDPOINT": spot,
        }
        command = [sys.executable, "-m", "torch.distributed.run", str(TORCHRUN_JOB)]
        return subprocess.Popen(
            [sys.executable, "-m", "training", "exec", "--", *command, "--steps", str(steps)],
            env=env,
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    first = tmp_path / "node-a"
    with FakeImds() as imds:
        job = torchrun(first, 1000, imds.url)
        wait_for_step(first / "ckpt" / "state.json", job, 3)
        imds.notify("terminate", "2026-01-01T00:02:00Z")
        out, _ = job.communicate(timeout=60)
    # torchrun itself exits 1 on a SIGTERM (SignalException); the stop makes it 75.
    assert job.returncode == ExitCode.INTERRUPTED, out
    assert "exec: the command exited 1 after the stop: run it again (75)" in out
    saved = json.loads((first / "ckpt" / "state.json").read_text())["step"]
    assert f"rank 0 saved at step {saved}; exit 75" in out
    assert f"rank 1 saved at step {saved}; exit 75" in out
    assert f"exec: CHECKPOINT_DIR mirrored to {s3_uri}/checkpoint-dir/node-0 (1 files" in out

    second = tmp_path / "node-b"  # the replacement node: an empty disk
    job = torchrun(second, saved + 2, "")
    out, _ = job.communicate(timeout=60)
    assert job.returncode == ExitCode.DONE, out
    assert f"exec: CHECKPOINT_DIR brought from {s3_uri}/checkpoint-dir/node-0 (1 files)" in out
    for rank in (0, 1):
        assert f"rank {rank} of 2: from step {saved}" in out
        assert f"rank {rank} done at step {saved + 2}" in out
    ci_log(
        f"command job test: torchrun (2 ranks) stopped by a spot notice saved at step {saved} "
        f"and exited 75; on an empty node it came back from S3 and resumed at step {saved}"
    )
