"""`down` against moto's server: the job is stopped through SSM, the spot requests are
cancelled before Pulumi destroys anything, and the data stays unless --delete-data."""

from __future__ import annotations

import argparse
import io
import json

import pytest

from infra.commands import down
from tests.infra.commands.conftest import (
    BUCKET,
    REPOSITORY,
    checkpoint_bucket,
    launch_nodes,
    stack_outputs,
)


def _resource(type_: str, name: str, *, custom: bool = True) -> dict:
    """One entry of a stack export's `resources`, as Pulumi writes it."""
    return {"urn": f"urn:pulumi:v100x1::gpu-training-stack::{type_}::{name}", "type": type_,
            "custom": custom}  # fmt: skip


RESOURCES = [
    _resource("pulumi:pulumi:Stack", "gpu-training-stack-v100x1", custom=False),
    _resource("gpu:infra:TrainingStack", "s", custom=False),
    _resource("pulumi:providers:aws", "s-aws"),
    _resource("aws:ec2/instance:Instance", "s-node-0"),
    _resource("aws:ec2/vpc:Vpc", "s-vpc"),
    _resource("aws:s3/bucket:Bucket", "s-ckpt"),
    _resource("aws:s3/bucketVersioning:BucketVersioning", "s-ckpt"),
    _resource("aws:ecr/repository:Repository", "s-repo"),
    _resource("aws:cloudwatch/logGroup:LogGroup", "s-logs"),
]


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
    stub_stack.resources = RESOURCES
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
    return argparse.Namespace(**{"stack": "v100x1", "yes": True, "delete_data": False, **values})


def test_down_cancels_the_spot_requests_before_destroy_and_keeps_the_data(spot_stack, aws):
    stack, instance_ids, seen = spot_stack
    assert len(aws.client("ec2").describe_spot_instance_requests()["SpotInstanceRequests"]) == 2
    out = io.StringIO()
    result = down.run(_args(), out=out, sleep=lambda s: None)
    assert seen["spot requests"] == []  # cancelled before the destroy began
    assert len(seen["versions"]) == 5  # 2 tags x 2 files + the pointer: all kept
    (destroy,) = [c for c in stack.calls if c[0] == "destroy"]
    assert sorted(destroy[1]["target"]) == sorted(
        r["urn"]
        for r in RESOURCES
        if r["type"]
        in ("aws:ec2/instance:Instance", "aws:ec2/vpc:Vpc", "aws:cloudwatch/logGroup:LogGroup")
    )
    text = out.getvalue()
    assert "stopping the job on 2 node(s)" in text
    assert all(f"{i}: Success" in text for i in instance_ids)
    assert "cancelled spot request(s)" in text
    assert f"s3://{BUCKET}: 5 object(s)" in result and "last checkpoint step_00000200" in result
    assert f"repository {REPOSITORY}: 1 image(s)" in result
    assert "--delete-data" in result


def test_delete_data_empties_the_bucket_and_repository_then_destroys_everything(spot_stack):
    stack, _, seen = spot_stack
    result = down.run(_args(delete_data=True), out=io.StringIO(), sleep=lambda s: None)
    assert seen["versions"] == [] and seen["images"] == [] and seen["spot requests"] == []
    (destroy,) = [c for c in stack.calls if c[0] == "destroy"]
    assert "target" not in destroy[1]
    assert "nothing remains" in result


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
        f"Destroy stack v100x1 (2 node(s)) and keep bucket {BUCKET} and repository "
        f"{REPOSITORY}? [y/N] "
    ]


def test_repository_name_from_the_image_uri():
    uri = "123456789012.dkr.ecr.us-east-1.amazonaws.com/gpu-stack-a100x8:0.1.0-torch2.13.0-cu130"
    assert down.repository_name(uri) == "gpu-stack-a100x8"
    assert down.repository_name(None) is None
