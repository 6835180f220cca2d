"""run, jobs and cancel on a Slurm cluster stack: the head node played by this host over the
real loopback two-node Slurm cluster (tests/support/head_node.py), the spool and the
checkpoints in moto's S3, a real training job on both nodes.

The head node's site differs from the stack's only where this host is no cluster node:
the batch script is rendered with the host's interpreter (Launch.host, as the other
cluster tests do) in a folder here, and sbatch runs as this user, not through
`sudo -iu ubuntu`; the script run submits, lists and cancels with is the stack's.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import pytest

from infra.cluster import jobs as slurm_jobs
from infra.cluster.jobs import SubmitSite
from infra.cluster.sbatch import BatchJob, Launch, render_sbatch
from infra.commands import cancel, jobs
from infra.commands import run as run_job
from tests.infra.cluster.jobs import DONE_STATES, JOB, JOB_TIMEOUT_S, STEPS
from tests.infra.commands.conftest import BUCKET
from tests.infra.commands.test_cluster_stack import STACK, Cluster
from tests.training.jobs import read_metrics
from tests.training.multirank import free_port

pytestmark = pytest.mark.multiprocess
TORCHRUN_JOB = Path(__file__).resolve().parents[3] / "tests" / "training" / "torchrun_job.py"


@pytest.fixture
def cluster(aws, stub_stack, slurm, monkeypatch, tmp_path):
    stack = Cluster(aws, stub_stack, slurm, monkeypatch)
    head = tmp_path / "head"
    head.mkdir()
    script = head / "train.sbatch"
    script.write_text(
        render_sbatch(
            BatchJob(
                nodes=2,
                launch=Launch.host(sys.executable),
                checkpoint_root=str(head / "ckpt"),
                s3_root=f"s3://{BUCKET}/checkpoints",
            )
        )
    )
    site = SubmitSite(job_script=str(script), jobs_dir=str(head / "jobs"))
    monkeypatch.setattr(slurm_jobs, "cluster_site", lambda bucket: site)
    # What the loopback cluster's jobs need in the submitting environment (sbatch
    # --export=ALL): one rank per node, a free port, no spot-notice endpoint.
    monkeypatch.setenv("TRAIN_NPROC_PER_NODE", "1")
    monkeypatch.setenv("TRAIN_MASTER_PORT", str(free_port()))
    monkeypatch.setenv("TRAIN_SPOT_ENDPOINT", "")
    stack.jobs_dir = head / "jobs"
    return stack


def wait_for(condition, timeout_s: float = JOB_TIMEOUT_S):
    deadline = time.monotonic() + timeout_s
    while not (found := condition()):
        assert time.monotonic() < deadline, f"not within {timeout_s} s"
        time.sleep(0.5)
    return found


@pytest.mark.slow(
    reason="the daily loop on the loopback Slurm cluster: run, jobs, cancel, resume of real jobs",
    seconds=200,
)
def test_run_submits_jobs_lists_cancel_checkpoints_and_the_same_name_resumes(
    cluster, slurm, tmp_path, ci_log
):
    config = tmp_path / "tiny.toml"
    config.write_text(f"[train]\nsteps = {STEPS}\n")
    args = argparse.Namespace(stack=STACK, config=config, code=None, name="tiny", overrides=JOB)
    said = run_job.run(args)
    assert said.startswith("job tiny submitted to l40sx4's Slurm queue as job ")
    first_id = said.split("as job ")[1].split()[0]
    metrics = cluster.jobs_dir / "runs" / "tiny"
    wait_for(lambda: len(read_metrics(metrics)) >= 3)

    listed = jobs.run(argparse.Namespace(stack=STACK)).splitlines()
    assert listed[1].split()[:4] == ["tiny", "running", "(slurm", f"{first_id},"]

    said = cancel.run(argparse.Namespace(stack=STACK, job="tiny"))
    ci_log(f"slurm test: run submitted tiny as job {first_id}; cancel: {said}")
    assert said.startswith(f"job tiny (slurm {first_id}) cancelled: the job stopped at step ")
    assert "(interrupted); step_" in said  # the checkpoint it committed, read from S3
    assert slurm.job(first_id)["JobState"] == "CANCELLED"
    assert jobs.run(argparse.Namespace(stack=STACK)).startswith("no job on l40sx4")
    before = [record["step"] for record in read_metrics(metrics)]
    assert before[0] == 1 and before[-1] < STEPS

    said = run_job.run(args)
    second_id = said.split("as job ")[1].split()[0]
    assert second_id != first_id
    state = wait_for(
        lambda: (s := slurm.job(second_id)["JobState"]) in DONE_STATES and s,
        timeout_s=JOB_TIMEOUT_S,
    )
    assert state == "COMPLETED"
    # metrics.jsonl is appended to: the second run's records follow the first's, and they go
    # on from the checkpoint instead of starting at step 1 again.
    after = [record["step"] for record in read_metrics(metrics)][len(before) :]
    assert 1 < after[0] <= before[-1] + 1 and after[-1] == STEPS
    ci_log(
        f"slurm test: run tiny again (job {second_id}) resumed at step {after[0]} and "
        f"finished at step {STEPS}"
    )

    # Any command as a job: a bare torchrun on both nodes (one rank each) joins through the
    # rendezvous exec hands it; cancelled, its ranks save on SIGTERM; run again under its name
    # on empty disks, it resumes from the copy of its CHECKPOINT_DIR in S3.
    saved_state = tmp_path / "head" / "ckpt" / "cmd" / "state.json"  # its CHECKPOINT_DIR
    torchrun = [sys.executable, "-m", "torch.distributed.run", str(TORCHRUN_JOB)]
    command = argparse.Namespace(
        stack=STACK,
        config=None,
        code=None,
        name="cmd",
        overrides=[],
        job_command=[*torchrun, "--steps", "1000"],
    )
    said = run_job.run(command)
    first_id = said.split("as job ")[1].split()[0]
    first_log = cluster.jobs_dir / f"train-{first_id}.out"
    # Both ranks in one process group across the nodes, and steps saved.
    wait_for(
        lambda: (
            first_log.exists()
            and "rank 0 of 2: from step 0" in first_log.read_text()
            and "rank 1 of 2: from step" in first_log.read_text()
            and saved_state.exists()
            and json.loads(saved_state.read_text())["step"] >= 3
        )
    )
    said = cancel.run(argparse.Namespace(stack=STACK, job="cmd"))
    assert said.startswith(f"job cmd (slurm {first_id}) cancelled")
    log = first_log.read_text()
    saved = json.loads(saved_state.read_text())["step"]
    for rank in (0, 1):  # after the same step: the stop was all-reduced
        assert f"rank {rank} saved at step {saved}; exit 75" in log, log[-3000:]
    assert log.count("exec: CHECKPOINT_DIR mirrored to s3://") == 2, log[-3000:]
    # Requeued onto other nodes: their disks hold nothing of the job; S3's copy brings it.
    for path in saved_state.parent.parent.glob("cmd*"):
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    command.job_command = [*torchrun, "--steps", str(saved + 2)]
    second_id = run_job.run(command).split("as job ")[1].split()[0]
    state = wait_for(
        lambda: (s := slurm.job(second_id)["JobState"]) in DONE_STATES and s,
        timeout_s=JOB_TIMEOUT_S,
    )
    log = (cluster.jobs_dir / f"train-{second_id}.out").read_text()
    assert state == "COMPLETED", log[-3000:]
    assert log.count("exec: CHECKPOINT_DIR brought from s3://") == 2, log[-3000:]
    for rank in (0, 1):
        assert f"rank {rank} of 2: from step {saved}" in log, log[-3000:]
        assert f"rank {rank} done at step {saved + 2}" in log, log[-3000:]
    ci_log(
        f"slurm test: torchrun command job cmd (job {first_id}, a rank on each node) "
        f"cancelled, saved at step {saved} and mirrored its CHECKPOINT_DIR to S3; run again "
        f"(job {second_id}) on empty disks it came back from S3, resumed at step {saved} and "
        "finished"
    )
