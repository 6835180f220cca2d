"""`stop` checkpoints and stops the nodes; `start` starts them again (moto's EC2 and SSM)."""

from __future__ import annotations

import argparse
import io

import pytest

from infra.commands import start, stop
from infra.deployed import cluster_fleet
from infra.errors import ConfigError
from infra.outputs import read_outputs
from tests.infra.commands.conftest import (
    checkpoint_bucket,
    cluster_outputs,
    launch_nodes,
    stack_outputs,
)
from tests.support.aws import fleet_table


def _states(ec2, ids):
    reply = ec2.describe_instances(InstanceIds=ids)["Reservations"]
    return {i["InstanceId"]: i["State"]["Name"] for r in reply for i in r["Instances"]}


def test_stop_then_start(aws, stub_stack):
    ec2 = aws.client("ec2")
    ids = launch_nodes(ec2, 2, spot=True)
    checkpoint_bucket(aws.client("s3"), ["step_00000300"])
    stub_stack.outputs_ = stack_outputs(ids, spot=True)
    args = argparse.Namespace(stack="l4x1")

    out = io.StringIO()
    result = stop.run(args, out=out, sleep=lambda s: None)
    assert set(_states(ec2, ids).values()) == {"stopped"}
    assert "stopping the job on 2 node(s)" in out.getvalue()
    assert "the job published no progress" in out.getvalue()  # no status.json in this bucket
    (command,) = aws.client("ssm").list_commands()["Commands"]
    assert command["Parameters"]["commands"] == ["systemctl stop gpu-training"]
    assert "stopped 2 node(s) of l4x1" in result and "step_00000300" in result
    assert "nothing to stop" in stop.run(args, out=io.StringIO(), sleep=lambda s: None)

    result = start.run(args)
    assert set(_states(ec2, ids).values()) == {"running"}
    assert "starting 2 node(s)" in result and "resumes from step_00000300" in result
    assert "nothing to start" in start.run(args)


def test_a_stack_without_instances_says_how_to_create_them(aws, stub_stack):
    stub_stack.outputs_ = {}
    with pytest.raises(ConfigError, match="python -m infra up l4x1"):
        start.run(argparse.Namespace(stack="l4x1"))


# What the spend guard leaves on a cluster it stopped at the budget: the fleet's status item
# as ParallelCluster keeps it (infra/functions/fleet.py), here in moto's DynamoDB.
CLUSTER = "gpu-training-stack-a100x8"


def _fleet_status(dynamodb) -> dict:
    item = dynamodb.get_item(
        TableName=f"parallelcluster-{CLUSTER}", Key={"Id": {"S": "COMPUTE_FLEET"}}
    )["Item"]
    return {key: value["S"] for key, value in item["Data"]["M"].items()}


def _cluster(status_after_naps: list[str], dynamodb):
    """The cluster stack, and a sleep that plays clustermgtd: each nap moves the fleet on."""
    from infra.deployed import workspace

    outputs = cluster_outputs(head_node="i-0", cluster_name=CLUSTER)
    stack = workspace.Deployed("a100x8", "us-east-1", read_outputs("a100x8", outputs))

    def nap(seconds: float) -> None:
        status = status_after_naps.pop(0)
        dynamodb.update_item(
            TableName=f"parallelcluster-{CLUSTER}",
            Key={"Id": {"S": "COMPUTE_FLEET"}},
            UpdateExpression="SET #d.#s = :s",
            ExpressionAttributeNames={"#d": "Data", "#s": "status"},
            ExpressionAttributeValues={":s": {"S": status}},
        )

    return stack, nap


def test_start_starts_a_fleet_the_guard_stopped_once_parallelcluster_has_stopped_it(aws):
    dynamodb = aws.client("dynamodb")
    fleet_table(dynamodb, CLUSTER, "STOP_REQUESTED")
    stack, nap = _cluster(["STOPPING", "STOPPED"], dynamodb)
    said = []
    cluster_fleet.start_fleet(stack, say=said.append, sleep=nap)
    fleet = _fleet_status(dynamodb)
    # Only from STOPPED, as pcluster update-compute-fleet does: after two of clustermgtd's steps.
    assert fleet["status"] == "START_REQUESTED"
    assert fleet["lastStatusUpdatedTime"] != "2026-12-01 10:00:00.000000+00:00"
    assert said[0].startswith("the compute fleet is STOP_REQUESTED: waiting for ParallelCluster")
    assert said[-1].startswith("compute fleet START_REQUESTED")


def test_start_leaves_a_running_fleet_alone(aws):
    dynamodb = aws.client("dynamodb")
    fleet_table(dynamodb, CLUSTER, "RUNNING")
    stack, nap = _cluster([], dynamodb)
    said = []
    cluster_fleet.start_fleet(stack, say=said.append, sleep=nap)
    assert _fleet_status(dynamodb)["status"] == "RUNNING" and said == []


def test_a_fleet_that_does_not_finish_stopping_is_one_line_and_left_as_it_is(aws):
    dynamodb = aws.client("dynamodb")
    fleet_table(dynamodb, CLUSTER, "STOPPING")
    stack, nap = _cluster(
        ["STOPPING"] * (cluster_fleet.FLEET_STOP_WAIT_S // cluster_fleet.FLEET_POLL_S), dynamodb
    )
    with pytest.raises(
        ConfigError, match=r"still STOPPING after 600 s: run `python -m infra start"
    ):
        cluster_fleet.start_fleet(stack, say=lambda line: None, sleep=nap)
    assert _fleet_status(dynamodb)["status"] == "STOPPING"


def test_a_fleet_stop_is_requested_and_waited_for_until_parallelcluster_has_stopped_it(aws):
    dynamodb = aws.client("dynamodb")
    fleet_table(dynamodb, CLUSTER, "RUNNING")
    stack, nap = _cluster(["STOPPING", "STOPPED"], dynamodb)
    seen = []

    def clustermgtd(seconds: float) -> None:
        seen.append(_fleet_status(dynamodb)["status"])  # what it finds at each of its loops
        nap(seconds)

    said = []
    cluster_fleet.stop_fleet(stack, say=said.append, sleep=clustermgtd)
    assert seen == ["STOP_REQUESTED", "STOPPING"]
    assert _fleet_status(dynamodb)["status"] == "STOPPED"
    assert said == [
        "compute fleet STOP_REQUESTED: waiting for ParallelCluster to stop it",
        "compute fleet STOPPED",
    ]
