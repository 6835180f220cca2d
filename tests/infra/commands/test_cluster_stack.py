"""status, stop, start, logs and down on a Slurm cluster stack: its instances in moto's EC2, its
head node played by this host over the real loopback Slurm cluster (tests/support/head_node.py),
and a real training job that mirrors its checkpoints and progress to moto's S3.
"""

from __future__ import annotations

import argparse
import io
import re
import time

import pytest

from infra.cluster.control import LOG_PIECE_BYTES
from infra.commands import down, logs, start, status, stop
from infra.deployed import workspace
from infra.errors import ConfigError
from tests.infra.cluster.jobs import DONE_STATES, STEPS, Submitted
from tests.infra.commands.conftest import (
    BUCKET,
    CLUSTER_ONLY,
    cluster_outputs,
    log_args,
)
from tests.support.aws import an_image, fleet_table
from tests.support.head_node import HeadNodeSSM

pytestmark = pytest.mark.multiprocess

STACK = "l40sx4"
TAG = ("gpu-stack", f"gpu-training-stack-{STACK}")
ARGS = argparse.Namespace(stack=STACK, watch=None)
NO_WAIT = {"sleep": lambda seconds: None}


def _instance(ec2, image, instance_type, tags, *, spot=False) -> str:
    options = {"InstanceMarketOptions": {"MarketType": "spot"}} if spot else {}
    reply = ec2.run_instances(
        ImageId=image,
        MinCount=1,
        MaxCount=1,
        InstanceType=instance_type,
        TagSpecifications=[
            {"ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}
        ],
        **options,
    )
    return reply["Instances"][0]["InstanceId"]


class Cluster:
    """The stack as ParallelCluster leaves it: a head node, compute nodes, the bucket."""

    def __init__(self, aws, stub_stack, slurm, monkeypatch):
        self.ec2 = ec2 = aws.client("ec2")
        image = an_image(ec2)
        stack_tag = {TAG[0]: TAG[1]}
        self.head = _instance(
            ec2, image, "m5.large", {**stack_tag, "parallelcluster:node-type": "HeadNode"}
        )
        compute = {**stack_tag, "parallelcluster:node-type": "Compute"}
        self.compute = [_instance(ec2, image, "g6e.12xlarge", compute, spot=True) for _ in "ab"]
        ended = _instance(ec2, image, "g6e.12xlarge", compute, spot=True)
        ec2.terminate_instances(InstanceIds=[ended])  # scaled down: not a node any more
        _instance(ec2, image, "p4d.24xlarge", {TAG[0]: "gpu-training-stack-other"})
        aws.client("s3").create_bucket(Bucket=BUCKET)
        fleet_table(aws.client("dynamodb"), CLUSTER_ONLY["cluster_name"], "RUNNING")
        stub_stack.outputs_ = cluster_outputs(
            cost_tag="=".join(TAG),
            instance_type="g6e.12xlarge",
            nodes=2,
            market="spot",
            queue="gpu",
            head_node=self.head,
            checkpoint_bucket=BUCKET,
            checkpoint_uri=f"s3://{BUCKET}/checkpoints",
            hourly_cost_usd=9.42,
            idle_usd_per_hour=0.096,
            monthly_budget_usd=500.0,
        )
        self.ssm = HeadNodeSSM(slurm, self.head)
        to_moto = workspace.aws
        monkeypatch.setattr(
            workspace,
            "aws",
            lambda service, region: self.ssm if service == "ssm" else to_moto(service, region),
        )

    def state(self, instance_id: str) -> str:
        reply = self.ec2.describe_instances(InstanceIds=[instance_id])["Reservations"]
        return reply[0]["Instances"][0]["State"]["Name"]


@pytest.fixture
def cluster(aws, stub_stack, slurm, monkeypatch):
    return Cluster(aws, stub_stack, slurm, monkeypatch)


def _rows(text: str, first: str) -> list[list[str]]:
    """The rest of each table row that starts with `first`."""
    return [line.split()[1:] for line in text.splitlines() if line.split()[:1] == [first]]


def test_status_lists_the_stacks_live_instances_and_an_empty_queue(cluster):
    text = status.run(ARGS)
    assert _rows(text, "head") == [[cluster.head, "m5.large", "running", "on-demand"]]
    assert sorted(row[0] for row in _rows(text, "compute")) == sorted(cluster.compute)
    assert {tuple(row[1:]) for row in _rows(text, "compute")} == {
        ("g6e.12xlarge", "running", "spot")
    }
    assert "queue       empty" in text
    assert "$9.42/h with every node running; $0.10/h idle" in text


def test_status_still_reports_when_the_head_node_does_not_answer_ssm(cluster):
    cluster.ssm.unregistered_for = 1
    text = status.run(ARGS)
    assert f"queue       unknown: the head node {cluster.head} of l40sx4 does not answer" in text
    assert _rows(text, "head") and "spend       " in text  # the rest is there
    cluster.ssm.unregistered_for = 1
    with pytest.raises(ConfigError, match="its agent is not registered"):
        stop.run(ARGS, out=io.StringIO(), **NO_WAIT)


@pytest.mark.slow(
    reason="stack commands against the loopback Slurm cluster with a real job in it", seconds=300
)
def test_a_job_is_shown_held_by_stop_released_by_start_and_its_log_read(cluster, slurm):
    """The head node's scripts (infra/cluster/control.py) at work under the commands: a stop
    holds every job of the queue, a running one after its SIGTERM checkpoint, and keeps it
    held; a start releases it and it resumes from that checkpoint."""
    job = Submitted(slurm, name="run1", s3_root=f"s3://{BUCKET}/checkpoints")
    job.wait_for_step(3)
    waiting = Submitted(slurm, name="run2")  # both nodes are taken

    text = status.run(ARGS)
    ((name, state, nodes, *_),) = _rows(text, job.id)
    assert (name, state, nodes) == ("run1", "running", "2")
    assert f"of {STEPS} " in next(line for line in text.splitlines() if line.startswith("job run1"))
    assert [row[:2] for row in _rows(text, waiting.id)] == [["run2", "waiting"]]

    said = io.StringIO()
    result = stop.run(ARGS, out=said, **NO_WAIT)
    assert "held 2 job(s) of l40sx4" in result and "10 idle minutes" in result
    stopped = next(
        line for line in said.getvalue().splitlines() if line.startswith(f"job {job.id} ")
    )
    assert "(interrupted)" in stopped and "step_" in stopped  # its checkpoint, read from S3
    stops = re.findall(r"stopped at step (\d+) \(SIGTERM\); checkpoint saved", job.log)
    assert len(stops) == 2 and stops[0] == stops[1], job.log[-3000:]  # both ranks
    # Past the time a requeued job may start again (cred_expire + 1 s): both still held.
    time.sleep(12)
    for held in (job, waiting):
        assert held.state()["JobState"] == "PENDING" and held.state()["Priority"] == "0"
    ((_, state, *_),) = _rows(status.run(ARGS), job.id)
    assert state == "held"
    slurm.command("scancel", waiting.id)

    # The spend guard stopped the head node; its SSM agent takes a moment to come back.
    cluster.ec2.stop_instances(InstanceIds=[cluster.head])
    assert "queue       unknown: the head node is stopped" in status.run(ARGS)
    cluster.ssm.unregistered_for = 2
    said = io.StringIO()
    result = start.run(ARGS, out=said, **NO_WAIT)
    assert cluster.state(cluster.head) == "running"
    assert f"starting the head node {cluster.head}" in said.getvalue()
    assert f"job {job.id} (run1) released: resumes from step_" in result

    # --follow prints what the resumed job adds, until Ctrl-C (here: once the job is done).
    def sleep_until_done(seconds):
        if job.state()["JobState"] in DONE_STATES:
            raise KeyboardInterrupt
        time.sleep(seconds)

    followed = io.StringIO()
    logs.run(log_args(stack=STACK, follow=True), out=followed, sleep=sleep_until_done)
    assert job.state()["JobState"] == "COMPLETED", job.log[-3000:]
    whole = job.log.encode()
    assert len(followed.getvalue().encode()) > LOG_PIECE_BYTES
    # The job's last lines may land after the last poll: all that was printed is the log's
    # text from where it started, in order.
    printed = followed.getvalue().encode()
    assert printed in whole and b"resumed from" in printed

    step = int(stops[0])
    assert re.search(rf"resumed from \S+/step_{step:08d} at step {step}\b", job.log)
    assert [record["step"] for record in job.metrics] == list(range(1, STEPS + 1))

    # Without --follow: the file's last piece, which ends with the run's summary.
    read = io.StringIO()
    logs.run(log_args(stack=STACK, job=job.id), out=read)
    assert read.getvalue().encode() == whole[-LOG_PIECE_BYTES:]
    assert "done: " in read.getvalue()


def test_logs_name_what_a_cluster_job_log_takes(cluster):
    with pytest.raises(ConfigError, match="holds every node's lines"):
        logs.run(log_args(stack=STACK, node=1))
    with pytest.raises(ConfigError, match="a Slurm job id is a number"):
        logs.run(log_args(stack=STACK, job="x"))
    with pytest.raises(ConfigError, match="the queue of l40sx4 is empty"):
        logs.run(log_args(stack=STACK))


def test_stop_and_start_with_the_head_node_stopped(cluster):
    cluster.ec2.stop_instances(InstanceIds=[cluster.head])
    assert "is stopped: no job runs, nothing to stop" in stop.run(ARGS, out=io.StringIO())
    result = start.run(ARGS, out=io.StringIO(), **NO_WAIT)
    assert "the queue of l40sx4 is empty: nothing to resume" in result


def test_start_lists_a_job_slurm_put_back_in_the_queue_unheld(cluster, slurm):
    """A job requeued unheld (its node lost, or a budget stop that could not hold it) starts
    again with the fleet: `start` names it, not "nothing to resume"."""
    waiting = slurm.command(
        "sbatch",
        "--parsable",
        "--job-name=run3",
        "--begin=now+1hour",
        "--wrap=true",
        env={**slurm.env, **slurm.job_variables()},
        as_job_user=True,
    ).strip()
    try:
        result = start.run(ARGS, out=io.StringIO(), **NO_WAIT)
        assert f"  job {waiting} (run3) pending: resumes from step 0" in result, result
        assert "nothing to resume" not in result
    finally:
        slurm.command("scancel", waiting, check=False)


@pytest.mark.slow(
    reason="stack commands against the loopback Slurm cluster with a real job in it", seconds=100
)
def test_down_holds_the_queue_before_the_destroy(cluster, stub_stack, slurm):
    job = Submitted(slurm, name="run2", s3_root=f"s3://{BUCKET}/checkpoints")
    job.wait_for_step(2)
    seen = {}
    stub_stack.on_destroy = lambda options: seen.update(state=job.state())
    said = io.StringIO()
    down.run(argparse.Namespace(stack=STACK, yes=True, delete_data=False), out=said, **NO_WAIT)
    assert seen["state"]["JobState"] == "PENDING" and seen["state"]["Priority"] == "0"
    assert "stopped at step" in said.getvalue()
    assert [call[0] for call in stub_stack.calls].count("destroy") == 1
    slurm.command("scancel", job.id)


def test_down_lists_the_clusters_kept_log_group_and_deletes_it_with_delete_data(
    cluster, stub_stack, aws
):
    cloudwatch_logs = aws.client("logs")
    prefix = f"/aws/parallelcluster/{TAG[1]}-"
    cloudwatch_logs.create_log_group(logGroupName=f"{prefix}202612011828")
    cloudwatch_logs.create_log_group(logGroupName="/aws/parallelcluster/another-202612011828")
    stub_stack.outputs_["cluster_log_group_prefix"] = prefix
    result = down.run(argparse.Namespace(stack=STACK, yes=True, delete_data=False), **NO_WAIT)
    # The stub's destroy leaves the cluster's nodes in moto: down names them as still billing
    # (exit 1); the kept log group is listed apart, with what is kept on purpose.
    kept = result.text.split("still there though the stack is gone")[0]
    assert f"  log group {prefix}202612011828 (0.00 GB stored): $0.00 a month" in kept
    assert "another" not in result.text
    said = io.StringIO()
    down.run(argparse.Namespace(stack=STACK, yes=True, delete_data=True), out=said, **NO_WAIT)
    assert f"deleted the log group {prefix}202612011828" in said.getvalue()
    left = cloudwatch_logs.describe_log_groups(logGroupNamePrefix="/aws/parallelcluster/")
    assert [g["logGroupName"] for g in left["logGroups"]] == [
        "/aws/parallelcluster/another-202612011828"
    ]
