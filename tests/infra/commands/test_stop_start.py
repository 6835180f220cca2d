"""`stop` checkpoints and stops the nodes; `start` starts them again (moto's EC2 and SSM)."""

from __future__ import annotations

import argparse
import io

import pytest

from infra.commands import start, stop
from infra.errors import ConfigError
from tests.infra.commands.conftest import checkpoint_bucket, launch_nodes, stack_outputs


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
