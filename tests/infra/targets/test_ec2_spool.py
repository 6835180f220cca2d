"""The single-node target (infra/targets/ec2_spool.py) against the node's own job watcher,
with the spool, the job's code and its checkpoints in moto's S3: a torchrun command job
is cancelled with a checkpoint on one node and resumes on its replacement from S3.

The node is the simulated host of tests/infra/node/test_simulated_boot.py, its aws CLI
answered by moto (tests/infra/node/aws_on_moto.py), its `docker run` running the job's
`python -m training exec -- COMMAND` with this interpreter. The container's environment is
the job.env the watcher writes, plus what a GPU-less host needs: moto's endpoint, two ranks.
"""

from __future__ import annotations

import datetime
import json
import re
import shutil
import sys
import time
from pathlib import Path

import boto3
import pytest

from infra.commands.run import code_archive
from infra.deployed.workspace import Deployed
from infra.jobs.spool import JobSpec
from infra.node import boot as userdata
from infra.outputs import read_outputs
from infra.targets.ec2_spool import SpoolTarget
from tests.infra.commands.conftest import stack_outputs
from tests.infra.node.test_simulated_boot import (
    p4d_node,
    simulated_host,
    start_unit,
    start_unit_in_background,
    wait_for,
)
from tests.support.aws import FAKE_CREDENTIALS, REGION, reset
from tests.training.multirank import free_port

REPO = Path(__file__).resolve().parents[3]
TORCHRUN_JOB = REPO / "tests" / "training" / "torchrun_job.py"
BUCKET = "stack-checkpoints"  # p4d_node()'s checkpoint bucket
JOB = "sweep"


@pytest.fixture
def moto(monkeypatch, moto_endpoint):
    reset(moto_endpoint)
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", FAKE_CREDENTIALS["aws_access_key_id"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", FAKE_CREDENTIALS["aws_secret_access_key"])
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    for key in ("AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(key, raising=False)
    return moto_endpoint


def node(tmp_path: Path, name: str, endpoint: str, idle_s: int):
    folder = tmp_path / name
    folder.mkdir()
    return simulated_host(
        folder,
        p4d_node(),
        default_job=False,
        idle_s=idle_s,
        poll_s=1,  # each poll starts a Python aws CLI (aws_on_moto.py): a second of CPU
        on_moto=True,
        AWS_ENDPOINT_URL=endpoint,
        AWS_ACCESS_KEY_ID=FAKE_CREDENTIALS["aws_access_key_id"],
        AWS_SECRET_ACCESS_KEY=FAKE_CREDENTIALS["aws_secret_access_key"],
        JOB_PYTHON=sys.executable,
        PYTHONPATH=str(REPO),
        TRAIN_NPROC_PER_NODE="2",
        TRAIN_MASTER_PORT=str(free_port()),
        TRAIN_SPOT_ENDPOINT="",
    )


@pytest.mark.multiprocess
@pytest.mark.slow(
    reason="a torchrun job through the real job watcher on two simulated nodes, in moto's S3",
    seconds=90,
)
def test_a_torchrun_job_cancelled_on_one_node_resumes_on_its_replacement_from_s3(
    tmp_path, moto, ci_log
):
    s3 = boto3.client("s3", region_name=REGION)
    s3.create_bucket(Bucket=BUCKET)
    outputs = stack_outputs(
        ["i-0"], spot=False, checkpoint_bucket=BUCKET, checkpoint_uri=f"s3://{BUCKET}/checkpoints"
    )
    target = SpoolTarget(Deployed("p4d", REGION, read_outputs("p4d", outputs)))
    project = tmp_path / "project"  # `run p4d --code project -- torchrun ...`
    project.mkdir()
    shutil.copy(TORCHRUN_JOB, project / "torchrun_job.py")

    def submit(steps: int) -> str:
        torchrun = (sys.executable, "-m", "torch.distributed.run", "torchrun_job.py")
        spec = JobSpec(
            name=JOB,
            config_toml="",
            usd_per_hour=32.77,
            has_code=True,
            submitted_at=datetime.datetime.now(datetime.UTC),
            command=(*torchrun, "--steps", str(steps)),
        )
        return target.submit(spec, code_archive(project))

    assert submit(1000).startswith(f"job {JOB} queued on p4d")
    first = node(tmp_path, "node-a", moto, idle_s=60)
    unit = start_unit_in_background(first)
    try:
        state = first.path(f"{userdata.STATE_DIR}/checkpoints/{JOB}/state.json")
        wait_for(lambda: state.exists() and json.loads(state.read_text())["step"] >= 3, 60)
        cancelled = target.cancel(JOB, sleep=time.sleep, now=time.monotonic)
    finally:
        unit.kill()
    output = unit.communicate(timeout=30)[0]
    assert cancelled.startswith(f"job {JOB} cancelled"), output[-3000:]
    saved = json.loads(state.read_text())["step"]
    assert f"rank 0 saved at step {saved}; exit 75" in output, output[-3000:]
    assert "exec: the command exited 1 after the stop: run it again (75)" in output
    uri = f"s3://{BUCKET}/checkpoints/{JOB}/checkpoint-dir/node-0"
    assert f"exec: CHECKPOINT_DIR mirrored to {uri} (1 files" in output
    assert [(job.name, job.state) for job in target.jobs().jobs] == [(JOB, "cancelled")]

    # The node is gone; its replacement's disk holds nothing of the job.
    assert submit(saved + 2).startswith(f"job {JOB} was cancelled: it resumes")
    replacement = node(tmp_path, "node-b", moto, idle_s=2)
    result = start_unit(replacement, timeout=120)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert f"exec: CHECKPOINT_DIR brought from {uri} (1 files)" in output, output[-3000:]
    assert sorted(re.findall(r"rank (\d) of 2: from step (\d+)", output)) == [
        ("0", str(saved)),
        ("1", str(saved)),
    ]
    assert f"rank 0 done at step {saved + 2}" in output
    assert [(job.name, job.state) for job in target.jobs().jobs] == [(JOB, "done")]
    ci_log(
        f"job spool test: torchrun command job {JOB} cancelled through the node's watcher "
        f"saved at step {saved}, mirrored to S3; on a replacement node it came back from S3 "
        f"and resumed at step {saved}"
    )
