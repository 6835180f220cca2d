"""`up` and `preview` on a cluster stack: what the cluster's update needs, in
ParallelCluster's own words (its ConfigPatch in .venv-pcluster), before anything changes;
the fleet stopped around Pulumi's up when ParallelCluster needs it; a failed first create
recovered.

Pulumi's preview is a stub (tests/infra/commands/conftest.py) that reports the cluster's
step as the engine does, with the old and new CloudFormation templates the real program
renders (tests/support/stack_runs.py, cluster_template); AWS is moto's; the head node is
this host over the loopback Slurm cluster (tests/support/head_node.py); clustermgtd is
played by the `sleep` the command waits with.
"""

from __future__ import annotations

import argparse
import io
import re

import pytest
import yaml
from pulumi.automation import events

from infra.cluster.update import cluster_configuration, run_check
from infra.commands import up
from infra.errors import ConfigError
from infra.functions import fleet
from tests.infra.cluster.test_config import pcluster_python
from tests.infra.commands.conftest import cluster_outputs
from tests.infra.commands.test_cluster_stack import STACK, Cluster
from tests.infra.commands.test_up import READY
from tests.support.aws import fleet_table
from tests.support.stack_runs import BASE_CONFIG, cluster_template

__all__ = ["pcluster_python"]  # the fixture

CLUSTER_NAME = f"gpu-training-stack-{STACK}"
RESOURCE = f"{CLUSTER_NAME}-cluster"
URN = (
    f"urn:pulumi:{STACK}::gpu-training-stack::gpu:infra:TrainingStack$gpu:infra:SlurmCluster"
    f"$aws:cloudformation/stack:Stack::{RESOURCE}"
)
# The deployed stack: a two-node p4d.24xlarge spot cluster.
DEPLOYED = {"cluster": "slurm", "nodes": 2, "instanceType": "p4d.24xlarge", "spot": True}


def write_stack_file(tmp_path, monkeypatch, config: dict) -> None:
    """Pulumi.<STACK>.yaml with BASE_CONFIG and `config`, where `up` reads it."""
    settings = {
        "aws:region": "us-east-1",
        **{f"gpu:{k}": v for k, v in {**BASE_CONFIG, **config}.items()},
    }
    path = tmp_path / f"Pulumi.{STACK}.yaml"
    path.write_text(yaml.safe_dump({"config": settings}))
    monkeypatch.setattr(up, "stack_file_path", lambda name: tmp_path / f"Pulumi.{name}.yaml")


def cluster_step(old: str | None, new: str, op: str = "update") -> events.EngineEvent:
    """The engine's event for the cluster's CloudFormation stack in a preview."""

    def state(body: str) -> events.StepEventStateMetadata:
        return events.StepEventStateMetadata(
            type="aws:cloudformation/stack:Stack",
            urn=URN,
            id="",
            parent="",
            provider="",
            inputs={"name": RESOURCE, "templateBody": body},
        )

    metadata = events.StepEventMetadata(
        op=events.OpType(op),
        urn=URN,
        type="aws:cloudformation/stack:Stack",
        provider="",
        old=state(old) if old else None,
        new=state(new),
    )
    return events.EngineEvent(
        sequence=1, timestamp=0, resource_pre_event=events.ResourcePreEvent(metadata=metadata)
    )


@pytest.fixture(autouse=True)
def outputs(stub_stack):
    """What the stack's program writes, for what `up` says once it is up."""
    stub_stack.outputs_ = cluster_outputs(head_node="i-0head", submit_command="sbatch ...")


def args(**values) -> argparse.Namespace:
    return argparse.Namespace(**{"stack": STACK, "yes": False, "policy_pack": True, **values})


def clustermgtd(dynamodb):
    """A sleep that plays clustermgtd: each nap moves a requested stop one step on."""
    steps = {"STOP_REQUESTED": "STOPPING", "STOPPING": "STOPPED"}

    def nap(seconds: float) -> None:
        status = fleet.status(dynamodb, CLUSTER_NAME)
        if status in steps:
            dynamodb.update_item(
                TableName=f"{fleet.TABLE_PREFIX}{CLUSTER_NAME}",
                Key={"Id": {"S": fleet.ITEM_ID}},
                UpdateExpression="SET #d.#s = :s",
                ExpressionAttributeNames={"#d": "Data", "#s": "status"},
                ExpressionAttributeValues={":s": {"S": steps[status]}},
            )

    return nap


@pytest.fixture
def cluster(aws, stub_stack, slurm, monkeypatch):
    stack = Cluster(aws, stub_stack, slurm, monkeypatch)
    stub_stack.outputs_["cluster_name"] = CLUSTER_NAME
    fleet_table(aws.client("dynamodb"), CLUSTER_NAME)
    return stack


@pytest.mark.parametrize(
    ("change", "described"),
    [
        (
            {"instanceType": "p5.48xlarge"},
            "Scheduling.SlurmQueues[gpu].ComputeResources p4d-24xlarge -> p5-48xlarge",
        ),
        (
            {"nodes": 1},
            "Scheduling.SlurmQueues[gpu].ComputeResources[p4d-24xlarge].MaxCount 2 -> 1",
        ),
    ],
    ids=["p4d-to-p5", "2-to-1-nodes"],
)
def test_a_change_that_needs_the_fleet_stopped_is_said_first_then_done_around_the_update(
    cluster,
    stub_stack,
    slurm,
    aws,
    tmp_path,
    monkeypatch,
    pcluster_python,
    ci_log,
    change,
    described,
):
    monkeypatch.setenv("PCLUSTER_PYTHON", pcluster_python)
    deployed = cluster_template(stack=STACK, **DEPLOYED)
    write_stack_file(tmp_path, monkeypatch, {**DEPLOYED, **change})
    sent = cluster_template(stack=STACK, **{**DEPLOYED, **change})
    stub_stack.preview_events = [cluster_step(deployed, sent)]
    dynamodb = aws.client("dynamodb")
    # A job waiting in the queue (its start an hour away), submitted by the jobs' user.
    waiting = slurm.command(
        "sbatch",
        "--parsable",
        "--begin=now+1hour",
        "--wrap=true",
        env={**slurm.env, **slurm.job_variables()},
        as_job_user=True,
    ).strip()

    out, seen = io.StringIO(), {}

    def ask(question: str) -> str:
        seen["said"] = out.getvalue()
        seen["asked"] = [call[0] for call in stub_stack.calls]
        seen["fleet"] = fleet.status(dynamodb, CLUSTER_NAME)
        return "y"

    def at_update(options) -> None:
        status = fleet.status(dynamodb, CLUSTER_NAME)
        answer = run_check(
            CLUSTER_NAME,
            cluster_configuration(deployed),
            cluster_configuration(sent),
            python=pcluster_python,
        )
        seen["update"] = (status, slurm.job(waiting)["Priority"])
        seen["accepted"] = answer["stopped" if status == fleet.STOPPED else "running"]["allowed"]

    stub_stack.on_up = at_update
    try:
        up.run(args(), out=out, ask=ask, probes=READY, sleep=clustermgtd(dynamodb))
        said = seen["said"].splitlines()
        verdict = next(line for line in said if line.startswith("cluster update:"))
        assert verdict.startswith("cluster update: a fleet stop: up checkpoints and holds the jobs")
        assert described in verdict
        # Said before anything changed: only the preview ran; the fleet still runs.
        assert seen["asked"] == ["export_stack", "preview"] and seen["fleet"] == "RUNNING"
        # ParallelCluster's check accepts what up sends, as the fleet is when it sends it.
        assert seen["update"] == ("STOPPED", "0") and seen["accepted"] is True
        assert fleet.status(dynamodb, CLUSTER_NAME) == fleet.START_REQUESTED
        assert slurm.job(waiting)["Priority"] != "0"  # released after the update
        text = out.getvalue()
        assert text.index("compute fleet STOPPED") < text.index("compute fleet START_REQUESTED")
        assert "released 1 job(s) held for the update" in text
        ci_log(f"cluster update test: {verdict}")
    finally:
        slurm.command("scancel", waiting, check=False)


def test_a_drain_updates_with_the_fleet_running(
    aws, stub_stack, tmp_path, monkeypatch, pcluster_python
):
    monkeypatch.setenv("PCLUSTER_PYTHON", pcluster_python)
    deployed = cluster_template(stack=STACK, **DEPLOYED)
    write_stack_file(tmp_path, monkeypatch, {**DEPLOYED, "spot": False})
    stub_stack.preview_events = [
        cluster_step(deployed, cluster_template(stack=STACK, **{**DEPLOYED, "spot": False}))
    ]
    out = io.StringIO()
    up.run(args(yes=True), out=out, probes=READY)
    assert (
        "cluster update: a drain: running jobs finish, then their nodes are replaced "
        "(Scheduling.SlurmQueues[gpu].CapacityType SPOT -> ONDEMAND)" in out.getvalue()
    )
    assert [call[0] for call in stub_stack.calls] == ["export_stack", "preview", "up", "outputs"]


def test_preview_ends_with_what_the_clusters_update_needs(
    aws, stub_stack, tmp_path, monkeypatch, pcluster_python
):
    monkeypatch.setenv("PCLUSTER_PYTHON", pcluster_python)
    deployed = cluster_template(stack=STACK, **DEPLOYED)
    write_stack_file(tmp_path, monkeypatch, {**DEPLOYED, "imageTag": "0.2.0-cu128"})
    stub_stack.preview_events = [
        cluster_step(deployed, cluster_template(stack=STACK, **DEPLOYED, imageTag="0.2.0-cu128"))
    ]
    line = up.run_preview(args(), out=io.StringIO())
    assert line.endswith("; cluster update: nothing: the cluster's configuration does not change")


def test_a_replacement_is_refused_before_anything_changes(aws, stub_stack, tmp_path, monkeypatch):
    write_stack_file(tmp_path, monkeypatch, DEPLOYED)
    body = cluster_template(stack=STACK, **DEPLOYED)
    stub_stack.preview_events = [cluster_step(body, body, op="replace")]
    with pytest.raises(ConfigError, match=r"cluster update: a replacement: .*`down` the stack"):
        up.run(args(yes=True), out=io.StringIO(), probes=READY)
    assert "up" not in [call[0] for call in stub_stack.calls]


def deleted_stack_id(cloudformation) -> str:
    """A stack whose create failed and that CloudFormation deleted (OnFailure DELETE)."""
    template = '{"Resources": {"Handle": {"Type": "AWS::CloudFormation::WaitConditionHandle"}}}'
    stack_id = cloudformation.create_stack(StackName=RESOURCE, TemplateBody=template)["StackId"]
    cloudformation.delete_stack(StackName=stack_id)
    return stack_id


@pytest.mark.parametrize("init_errors", [True, False], ids=["init-errors", "deleted-since"])
def test_up_after_a_failed_create_reads_the_cluster_back_and_creates_it_again(
    aws, stub_stack, tmp_path, monkeypatch, init_errors
):
    cloudformation = aws.client("cloudformation")
    stack_id = deleted_stack_id(cloudformation)
    assert cloudformation.describe_stacks(StackName=stack_id)["Stacks"][0]["StackStatus"] == (
        "DELETE_COMPLETE"
    )
    failed = {"urn": URN, "type": "aws:cloudformation/stack:Stack", "id": stack_id}
    if init_errors:
        failed["initErrors"] = [
            f"waiting for CloudFormation Stack ({stack_id}) create: stack status (DELETE_COMPLETE)"
        ]
    stub_stack.resources = [failed]
    body = cluster_template(stack=STACK, **DEPLOYED)
    write_stack_file(tmp_path, monkeypatch, DEPLOYED)

    def read_back(options):
        # terraform-provider-aws's read drops a stack CloudFormation no longer has.
        stub_stack.resources = []
        stub_stack.preview_events = [cluster_step(None, body, op="create")]

    stub_stack.on_refresh = read_back
    stub_stack.preview_events = [cluster_step(body, body)]  # what it would preview unrefreshed
    out = io.StringIO()
    up.run(args(yes=True), out=out, probes=READY)
    (refresh,) = [call for call in stub_stack.calls if call[0] == "refresh"]
    assert refresh[1]["target"] == [URN]
    pulumi_calls = [call[0] for call in stub_stack.calls if call[0] != "get_config"]
    assert pulumi_calls == ["export_stack", "refresh", "preview", "up", "outputs"]
    assert "cluster update: a new cluster: this up creates it" in out.getvalue()


def test_a_healthy_cluster_stack_is_not_refreshed(aws, stub_stack, tmp_path, monkeypatch):
    cloudformation = aws.client("cloudformation")
    template = '{"Resources": {"Handle": {"Type": "AWS::CloudFormation::WaitConditionHandle"}}}'
    stack_id = cloudformation.create_stack(StackName=RESOURCE, TemplateBody=template)["StackId"]
    stub_stack.resources = [{"urn": URN, "type": "aws:cloudformation/stack:Stack", "id": stack_id}]
    write_stack_file(tmp_path, monkeypatch, DEPLOYED)
    body = cluster_template(stack=STACK, **DEPLOYED)
    stub_stack.preview_events = [cluster_step(body, body, op="same")]
    up.run(args(yes=True), out=io.StringIO(), probes=READY)
    assert "refresh" not in [call[0] for call in stub_stack.calls]


def test_a_stack_name_parallelcluster_refuses_stops_up_before_pulumi(
    stub_stack, tmp_path, monkeypatch
):
    settings = {
        "aws:region": "us-east-1",
        **{f"gpu:{k}": v for k, v in {**BASE_CONFIG, **DEPLOYED}.items()},
    }
    (tmp_path / "Pulumi.l4_x1.yaml").write_text(yaml.safe_dump({"config": settings}))
    monkeypatch.setattr(up, "stack_file_path", lambda name: tmp_path / f"Pulumi.{name}.yaml")
    refused = (
        "Pulumi.l4_x1.yaml: stack name 'l4_x1' makes the Slurm cluster's name "
        "'gpu-training-stack-l4_x1', which ParallelCluster refuses"
    )
    with pytest.raises(ConfigError, match=re.escape(refused)):
        up.run(args(stack="l4_x1", yes=True), out=io.StringIO(), probes=READY)
    assert stub_stack.opened == []
