"""For the commands that talk to a stack: moto's AWS API on loopback, and a stub Pulumi stack.

The stub stands for pulumi.automation.Stack: it answers with the Automation API's own
value types (OutputValue, ConfigValue) and records every call a command makes.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import boto3
import pytest
from pulumi import automation as auto

from infra.deployed import workspace
from tests.support.aws import an_image, reset

REGION = "us-east-1"


@pytest.fixture
def aws(monkeypatch, moto_endpoint):
    """moto's server, emptied; boto3 reaches it through AWS_ENDPOINT_URL."""
    reset(moto_endpoint)
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    for key in ("AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(key, raising=False)
    return SimpleNamespace(client=lambda service: boto3.client(service, region_name=REGION))


@dataclass
class StubStack:
    """Records the Automation API calls; `on_destroy` sees AWS as it is at destroy time."""

    outputs_: dict[str, Any] = field(default_factory=dict)
    resources: list[dict] = field(default_factory=list)
    config: dict[str, str] = field(default_factory=lambda: {"aws:region": REGION})
    on_destroy: Any = None
    on_up: Any = None  # sees AWS as it is when Pulumi's up starts
    on_refresh: Any = None
    # What a preview's engine events report, each a pulumi.automation.events.EngineEvent.
    preview_events: list = field(default_factory=list)
    calls: list[tuple] = field(default_factory=list)

    def outputs(self):
        self.calls.append(("outputs",))
        return {key: auto.OutputValue(value, False) for key, value in self.outputs_.items()}

    def get_config(self, key, *, path=False):
        self.calls.append(("get_config", key))
        if key not in self.config:
            raise auto.CommandError(
                auto.CommandResult(
                    stdout="", stderr=f"configuration key '{key}' not found", code=255
                )
            )
        return auto.ConfigValue(self.config[key])

    def export_stack(self):
        self.calls.append(("export_stack",))
        return auto.Deployment(version=3, deployment={"resources": self.resources})

    def destroy(self, **options):
        self.calls.append(("destroy", options))
        if self.on_destroy is not None:
            self.on_destroy(options)
        return auto.DestroyResult(stdout="", stderr="", summary=None)

    def up(self, **options):
        self.calls.append(("up", options))
        if self.on_up is not None:
            self.on_up(options)
        return auto.UpResult(stdout="", stderr="", summary=None, outputs=self.outputs())

    def refresh(self, **options):
        self.calls.append(("refresh", options))
        if self.on_refresh is not None:
            self.on_refresh(options)
        return auto.RefreshResult(stdout="", stderr="", summary=None)

    def preview(self, **options):
        self.calls.append(("preview", options))
        for event in self.preview_events:
            options["on_event"](event)
        return auto.PreviewResult(
            stdout="",
            stderr="",
            change_summary={auto.OpType.CREATE: len(self.resources), auto.OpType.SAME: 2},
        )


@pytest.fixture
def stub_stack(monkeypatch):
    """Put a StubStack behind workspace.open_stack; `.opened` lists (name, create)."""
    stack = StubStack()
    stack.opened = []

    def open_stack(name, *, create=False):
        stack.opened.append((name, create))
        return stack

    monkeypatch.setattr(workspace, "open_stack", open_stack)
    return stack


BUCKET = "gpu-training-stack-l4x1-ckpt"
REPOSITORY = "gpu-training-stack-l4x1"
LOG_GROUP = "/gpu-training/gpu-training-stack-l4x1"


def launch_nodes(ec2, count: int, *, spot: bool) -> list[str]:
    """Running instances as Compute makes them (persistent spot requests that stop)."""
    image = an_image(ec2)
    if not spot:
        reply = ec2.run_instances(
            ImageId=image, MinCount=count, MaxCount=count, InstanceType="p3.2xlarge"
        )
        return [i["InstanceId"] for i in reply["Instances"]]
    ids = []
    for _ in range(count):
        request = ec2.request_spot_instances(
            InstanceCount=1,
            Type="persistent",
            InstanceInterruptionBehavior="stop",
            LaunchSpecification={"ImageId": image, "InstanceType": "p3.2xlarge"},
        )["SpotInstanceRequests"][0]
        found = ec2.describe_spot_instance_requests(
            SpotInstanceRequestIds=[request["SpotInstanceRequestId"]]
        )["SpotInstanceRequests"][0]
        ids.append(found["InstanceId"])
    return ids


def shared_outputs(**extra) -> dict[str, Any]:
    """The outputs both kinds of stack write (infra/outputs.py), for a stack in moto."""
    return {
        "instance_type": "p3.2xlarge",
        "nodes": 1,
        "market": "on-demand",
        "cost_tag": "gpu-stack=gpu-training-stack-l4x1",
        "image_uri": f"123456789012.dkr.ecr.{REGION}.amazonaws.com/{REPOSITORY}:0.1.0-cu128",
        "checkpoint_bucket": BUCKET,
        "checkpoint_uri": f"s3://{BUCKET}/checkpoints",
        "on_demand_usd_per_hour": 3.06,
        "spot_usd_per_hour": 0.75,
        "hourly_cost_usd": 3.06,
        "monthly_budget_usd": 100.0,
        "budget_name": "gpu-training-stack-l4x1-budget",
        "alert_topic_arn": f"arn:aws:sns:{REGION}:123456789012:gpu-training-stack-l4x1-alerts",
        "warnings": [],
        "kept_on_destroy": [f"s3://{BUCKET}"],
        **extra,
    }


def stack_outputs(instance_ids: list[str], *, spot: bool, **extra) -> dict[str, Any]:
    """The outputs the single-node stack writes, for a l4x1 stack in moto."""
    return shared_outputs(
        **{
            "kind": "ec2",
            "nodes": len(instance_ids),
            "market": "spot" if spot else "on-demand",
            "price_model": "spot" if spot else "on-demand",
            "availability_zone": f"{REGION}a",
            "instance_ids": instance_ids,
            "private_ips": [f"10.0.0.{10 + rank}" for rank in range(len(instance_ids))],
            "ssm_sessions": [f"aws ssm start-session --target {i}" for i in instance_ids],
            "log_group": LOG_GROUP,
            "runway_hours": 32.7,
            "hourly_cost_usd": 0.75 if spot else 3.06,
            **extra,
        }
    )


# The cluster stack's own outputs (infra/outputs.py, ClusterOutputs).
CLUSTER_ONLY = {
    "kind": "slurm",
    "cluster_name": "gpu-training-stack-a100x8",
    "parallelcluster_version": "3.14.0",
    "queue": "gpu",
    "head_node": "i-0head",
    "head_node_ip": "10.0.1.5",
    "submit_command": "sbatch ...",
    "idle_usd_per_hour": 0.21,
    "cluster_log_group_prefix": "/aws/parallelcluster/gpu-training-stack-a100x8",
}


def cluster_outputs(**extra) -> dict[str, Any]:
    """The outputs the cluster stack writes (its own fields changed by `extra`)."""
    return shared_outputs(**{**CLUSTER_ONLY, **extra})


def checkpoint_bucket(s3, tags: list[str]) -> None:
    """The bucket as the trainer's S3 mirror leaves it: step folders, then the pointer."""
    s3.create_bucket(Bucket=BUCKET)
    s3.put_bucket_versioning(Bucket=BUCKET, VersioningConfiguration={"Status": "Enabled"})
    for tag in tags:
        s3.put_object(
            Bucket=BUCKET, Key=f"checkpoints/{tag}/mp_rank_00_model_states.pt", Body=b"x" * 1024
        )
        s3.put_object(Bucket=BUCKET, Key=f"checkpoints/{tag}/commit.json", Body=b"{}")
    if tags:
        s3.put_object(Bucket=BUCKET, Key="checkpoints/latest_committed", Body=tags[-1].encode())


def log_args(**values) -> argparse.Namespace:
    """`logs`'s arguments: its defaults for stack l4x1, changed by `values`."""
    defaults = {"stack": "l4x1", "node": None, "follow": False, "since": 60, "job": None}
    return argparse.Namespace(**{**defaults, **values})
