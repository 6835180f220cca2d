"""`down` against moto's server: the job is stopped through SSM, the spot requests are
cancelled before Pulumi destroys anything, and the data Pulumi leaves is deleted only
with --delete-data."""

from __future__ import annotations

import argparse
import io
import json

import pytest

from infra.commands import down
from infra.commands.outcome import Outcome
from infra.deployed import workspace
from tests.infra.commands.conftest import (
    BUCKET,
    CLUSTER_ONLY,
    REPOSITORY,
    checkpoint_bucket,
    launch_nodes,
    stack_outputs,
)


@pytest.fixture
def spot_stack(aws, stub_stack):
    ec2, s3, ecr = aws.client("ec2"), aws.client("s3"), aws.client("ecr")
    instance_ids = launch_nodes(ec2, 2, spot=True)
    checkpoint_bucket(s3, ["step_00000100", "step_00000200"])
    ecr.create_repository(repositoryName=REPOSITORY)
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "config": {"digest": "sha256:" + "0" * 64, "size": 2},
        "layers": [],
    }
    ecr.put_image(
        repositoryName=REPOSITORY, imageManifest=json.dumps(manifest), imageTag="0.1.0-cu128"
    )
    stub_stack.outputs_ = stack_outputs(instance_ids, spot=True)
    seen = {}

    def at_destroy(options):
        # What AWS looks like the moment Pulumi starts destroying.
        seen["spot requests"] = ec2.describe_spot_instance_requests(
            Filters=[{"Name": "instance-id", "Values": instance_ids}]
        )["SpotInstanceRequests"]
        seen["versions"] = s3.list_object_versions(Bucket=BUCKET).get("Versions", [])
        seen["images"] = ecr.list_images(repositoryName=REPOSITORY)["imageIds"]

    stub_stack.on_destroy = at_destroy
    return stub_stack, instance_ids, seen


def _args(**values):
    return argparse.Namespace(**{"stack": "l4x1", "yes": True, "delete_data": False, **values})


def test_down_cancels_the_spot_requests_before_destroy_and_says_what_remains(spot_stack, aws):
    stack, instance_ids, seen = spot_stack
    assert len(aws.client("ec2").describe_spot_instance_requests()["SpotInstanceRequests"]) == 2
    out = io.StringIO()
    result = down.run(_args(), out=out, sleep=lambda s: None)
    assert seen["spot requests"] == []  # cancelled before the destroy began
    (destroy,) = [c for c in stack.calls if c[0] == "destroy"]
    assert "target" not in destroy[1]  # the whole stack: storage retains itself on delete
    text = out.getvalue()
    assert "stopping the job on 2 node(s)" in text
    assert all(f"{i}: Success" in text for i in instance_ids)
    assert "cancelled spot request(s)" in text
    # Pulumi's destroy left the bucket and repository (retain_on_delete): down names them.
    assert f"s3://{BUCKET}: 5 object(s)" in result and "last checkpoint step_00000200" in result
    assert f"repository {REPOSITORY}: 1 image(s)" in result
    assert "--delete-data" in result
    assert len(aws.client("s3").list_object_versions(Bucket=BUCKET)["Versions"]) == 5


def test_delete_data_deletes_what_the_destroy_left(spot_stack, aws):
    stack, _, seen = spot_stack
    result = down.run(_args(delete_data=True), out=io.StringIO(), sleep=lambda s: None)
    assert seen["spot requests"] == []
    assert [c[0] for c in stack.calls].count("destroy") == 1
    assert BUCKET not in [b["Name"] for b in aws.client("s3").list_buckets()["Buckets"]]
    repositories = aws.client("ecr").describe_repositories()["repositories"]
    assert REPOSITORY not in [r["repositoryName"] for r in repositories]
    assert "nothing remains" in result


def test_nothing_left_when_the_stack_deleted_its_own_data(spot_stack, aws):
    stack, _, _ = spot_stack

    def delete_data_on_destroy(options):  # gpu:deleteDataOnDestroy: Pulumi deletes both
        down.delete_bucket(aws.client("s3"), BUCKET)
        down.delete_repository(aws.client("ecr"), REPOSITORY)

    stack.on_destroy = delete_data_on_destroy
    # `up` or `run` stored the user's HF_TOKEN: it goes with the stack.
    secret = "gpu-stack/gpu-training-stack-l4x1/hf-token"
    aws.client("secretsmanager").create_secret(Name=secret, SecretString="hf_x")
    out = io.StringIO()
    assert down.run(_args(), out=out, sleep=lambda s: None) == (
        "stack l4x1 is destroyed; nothing remains"
    )
    assert f"deleted the stack's HF_TOKEN secret {secret}" in out.getvalue()
    assert aws.client("secretsmanager").list_secrets()["SecretList"] == []


def test_no_is_no(spot_stack, aws):
    stack, _, _ = spot_stack
    assert down.run(_args(yes=False), out=io.StringIO(), ask=lambda q: "") == (
        "nothing was destroyed"
    )
    assert [c[0] for c in stack.calls if c[0] == "destroy"] == []
    assert len(aws.client("ec2").describe_spot_instance_requests()["SpotInstanceRequests"]) == 2


def test_the_question_names_what_is_kept(spot_stack):
    asked = []
    down.run(_args(yes=False), out=io.StringIO(), ask=lambda q: asked.append(q) or "n")
    assert asked == [
        f"Destroy stack l4x1 (2 node(s)) and keep bucket {BUCKET} and repository "
        f"{REPOSITORY}? [y/N] "
    ]


def test_repository_name_from_the_image_uri():
    uri = "123456789012.dkr.ecr.us-east-1.amazonaws.com/gpu-stack-a100x8:0.1.0-torch2.13.0-cu130"
    assert down.repository_name(uri) == "gpu-stack-a100x8"
    assert down.repository_name(None) is None
    pinned = (
        "123456789012.dkr.ecr.us-east-1.amazonaws.com/gpu-stack-a100x8:0.1.0@sha256:" + "a" * 64
    )
    assert down.repository_name(pinned) == "gpu-stack-a100x8"


COST_TAG = ("gpu-stack", "gpu-training-stack-l4x1")


def test_down_lists_what_still_bills_after_the_destroy_and_exits_non_zero(spot_stack, aws):
    stack, instance_ids, _ = spot_stack
    stack.outputs_["cost_tag"] = "=".join(COST_TAG)
    ec2 = aws.client("ec2")
    tags = [{"Key": COST_TAG[0], "Value": COST_TAG[1]}]
    zone = ec2.describe_availability_zones()["AvailabilityZones"][0]["ZoneName"]
    volume = ec2.create_volume(
        AvailabilityZone=zone,
        Size=100,
        VolumeType="gp3",
        TagSpecifications=[{"ResourceType": "volume", "Tags": tags}],
    )["VolumeId"]
    address = ec2.allocate_address(
        Domain="vpc", TagSpecifications=[{"ResourceType": "elastic-ip", "Tags": tags}]
    )
    # Not the stack's: never listed.
    ec2.create_volume(AvailabilityZone=zone, Size=8, VolumeType="gp3")

    def destroy(options):  # the destroy ends the nodes and leaves the two behind
        ec2.terminate_instances(InstanceIds=instance_ids)

    stack.on_destroy = destroy
    result = down.run(_args(), out=io.StringIO(), sleep=lambda s: None)

    assert isinstance(result, Outcome) and result.exit_code == 1
    text = result.text
    # 100 GiB of gp3 at $0.08 a GB-month; a public IPv4 address at $0.005 an hour, 730 hours.
    assert f"  volume {volume} (100 GiB, available): $8.00 a month" in text
    assert (
        f"  elastic IP {address['AllocationId']} ({address['PublicIp']}, unattached): $3.65 a month"
    ) in text
    assert "still there though the stack is gone (about $11.65 a month):" in text
    # What the stack keeps on purpose is listed apart, not as unexpected.
    kept, unexpected = text.split("still there")
    assert f"s3://{BUCKET}" in kept and f"repository {REPOSITORY}" in kept
    assert BUCKET not in unexpected and "instance" not in unexpected


def test_down_with_nothing_left_carrying_the_tag_exits_zero(spot_stack, aws):
    stack, instance_ids, _ = spot_stack
    stack.outputs_["cost_tag"] = "=".join(COST_TAG)
    stack.on_destroy = lambda options: aws.client("ec2").terminate_instances(
        InstanceIds=instance_ids
    )
    result = down.run(_args(), out=io.StringIO(), sleep=lambda s: None)
    assert isinstance(result, str)
    assert result.startswith("stack l4x1 is destroyed; nothing else carrying its cost tag remains")


def test_down_of_a_cluster_lists_what_parallelcluster_keeps_apart(spot_stack, aws):
    stack, instance_ids, _ = spot_stack
    stack.outputs_.update(
        CLUSTER_ONLY,
        cost_tag="=".join(COST_TAG),
        cluster_log_group_prefix=f"/aws/parallelcluster/{COST_TAG[1]}-",
    )
    stack.on_destroy = lambda options: aws.client("ec2").terminate_instances(
        InstanceIds=instance_ids
    )
    shared = "parallelcluster-0123456789abcdef-v1-do-not-delete"
    aws.client("s3").create_bucket(Bucket=shared)
    kept_log = f"/aws/parallelcluster/{COST_TAG[1]}-202612011200"
    aws.client("logs").create_log_group(logGroupName=kept_log)
    aws.client("logs").create_log_group(logGroupName="/aws/parallelcluster/another-202612011200")
    result = down.run(_args(), out=io.StringIO(), sleep=lambda s: None)
    assert isinstance(result, str)  # nothing unexpected: exit 0
    assert f"  s3://{shared} (ParallelCluster's, for every cluster of" in result
    assert f"  log group {kept_log} (0.00 GB stored): $0.00 a month" in result
    assert "another" not in result


def test_down_of_a_cluster_lists_parallelclusters_lambda_log_groups_with_its_logs(spot_stack, aws):
    """ParallelCluster names its Lambda functions' log groups for the UUID of the cluster's
    CloudFormation stack, not for the cluster: found through that stack, deleted or not."""
    stack, instance_ids, _ = spot_stack
    cluster = COST_TAG[1]
    stack.outputs_.update(
        CLUSTER_ONLY,
        cost_tag="=".join(COST_TAG),
        cluster_name=cluster,
        cluster_log_group_prefix=f"/aws/parallelcluster/{cluster}-",
    )
    cloudformation, logs = aws.client("cloudformation"), aws.client("logs")
    template = json.dumps({"Resources": {"Topic": {"Type": "AWS::SNS::Topic"}}})
    stack_id = cloudformation.create_stack(StackName=cluster, TemplateBody=template)["StackId"]
    other_id = cloudformation.create_stack(StackName="another", TemplateBody=template)["StackId"]
    stack_uuid, other_uuid = stack_id.split("/")[2], other_id.split("/")[2]
    kept = [
        f"/aws/lambda/pcluster-CleanupResources-{stack_uuid}",
        f"/aws/lambda/pcluster-CleanupRoute53-{stack_uuid}",
    ]
    for name in [*kept, f"/aws/lambda/pcluster-CleanupResources-{other_uuid}"]:
        logs.create_log_group(logGroupName=name)

    def destroy(options):
        aws.client("ec2").terminate_instances(InstanceIds=instance_ids)
        cloudformation.delete_stack(StackName=cluster)  # ParallelCluster's stack goes too

    stack.on_destroy = destroy
    result = down.run(_args(), out=io.StringIO(), sleep=lambda s: None)
    assert isinstance(result, str)  # kept on purpose (the logs' DeletionPolicy), exit 0
    for name in kept:
        assert f"  log group {name} (0.00 GB stored): $0.00 a month" in result
    assert other_uuid not in result

    deleted = down.run(_args(delete_data=True), out=io.StringIO(), sleep=lambda s: None)
    assert isinstance(deleted, str)
    remaining = [g["logGroupName"] for g in logs.describe_log_groups()["logGroups"]]
    assert remaining == [f"/aws/lambda/pcluster-CleanupResources-{other_uuid}"]


class NestedStacks:
    """moto's CloudFormation, with what its ListStacks leaves out: a nested stack's summary
    names its parent (StackSummary.ParentId, AWS CloudFormation API Reference)."""

    def __init__(self, cloudformation, parents: dict[str, str]) -> None:
        self._client, self._parents = cloudformation, parents  # nested stack id -> parent id

    def __getattr__(self, name):
        return getattr(self._client, name)

    def get_paginator(self, operation):
        paginator = self._client.get_paginator(operation)
        if operation != "list_stacks":
            return paginator
        parents = self._parents

        class WithParents:
            def paginate(self, **kwargs):
                for page in paginator.paginate(**kwargs):
                    for summary in page["StackSummaries"]:
                        if summary["StackId"] in parents:
                            summary["ParentId"] = parents[summary["StackId"]]
                    yield page

        return WithParents()


def test_a_clean_cluster_destroy_exits_zero_with_its_kept_tagged_log_groups_listed_apart(
    spot_stack, aws, monkeypatch
):
    """The cluster's log group and its custom resource provider's both carry the stack's tag
    (the cluster config's Tags; the stack's tags, which CloudFormation passes on) and are
    kept on delete: listed as kept, not as left over, and `down` exits 0."""
    stack, instance_ids, _ = spot_stack
    cluster = COST_TAG[1]
    stack.outputs_.update(
        CLUSTER_ONLY,
        cost_tag="=".join(COST_TAG),
        cluster_name=cluster,
        cluster_log_group_prefix=f"/aws/parallelcluster/{cluster}-",
    )
    cloudformation, logs = aws.client("cloudformation"), aws.client("logs")
    template = json.dumps({"Resources": {"Topic": {"Type": "AWS::SNS::Topic"}}})
    ours = cloudformation.create_stack(StackName=f"{cluster}-cluster", TemplateBody=template)
    provider = cloudformation.create_stack(
        StackName=f"{cluster}-cluster-PclusterClusterProvider-1A2B3C", TemplateBody=template
    )
    parents = {provider["StackId"]: ours["StackId"]}
    to_moto = workspace.aws
    monkeypatch.setattr(
        workspace,
        "aws",
        lambda service, region: (
            NestedStacks(to_moto(service, region), parents)
            if service == "cloudformation"
            else to_moto(service, region)
        ),
    )
    tag = dict([COST_TAG])
    provider_log = f"/aws/lambda/pcluster-cfn-{provider['StackId'].rsplit('/', 1)[1]}"
    cluster_log = f"/aws/parallelcluster/{cluster}-202612011200"
    for name in (provider_log, cluster_log):
        logs.create_log_group(logGroupName=name, tags=tag)

    def destroy(options):
        aws.client("ec2").terminate_instances(InstanceIds=instance_ids)
        for stack_id in (provider["StackId"], ours["StackId"]):
            cloudformation.delete_stack(StackName=stack_id)

    stack.on_destroy = destroy
    result = down.run(_args(), out=io.StringIO(), sleep=lambda s: None)
    assert isinstance(result, str), result.text  # exit 0
    assert "still there" not in result
    kept = result.split("kept on purpose")[1]
    assert f"  log group {provider_log} (0.00 GB stored)" in kept
    assert f"  log group {cluster_log} (0.00 GB stored)" in kept
