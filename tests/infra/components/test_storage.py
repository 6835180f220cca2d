"""Storage: private encrypted versioned checkpoint bucket, immutable scanned repository, logs."""

from __future__ import annotations

import json

from infra.components.storage import NONCURRENT_VERSION_DAYS
from tests.support.mock_runs import one
from tests.support.stack_runs import run_stack, training_log_group


def test_checkpoint_bucket_is_private_encrypted_versioned_and_expires_old_versions():
    run = run_stack()
    bucket = one(run, "aws:s3/bucket:Bucket")
    block = one(run, "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock").inputs
    assert block["bucket"] == bucket.id
    for key in (
        "blockPublicAcls",
        "blockPublicPolicy",
        "ignorePublicAcls",
        "restrictPublicBuckets",
    ):
        assert block[key] is True, key
    (rule,) = one(
        run,
        "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration",
    ).inputs["rules"]
    assert rule["applyServerSideEncryptionByDefault"]["sseAlgorithm"] == "AES256"
    versioning = one(run, "aws:s3/bucketVersioning:BucketVersioning").inputs
    assert versioning["versioningConfiguration"]["status"] == "Enabled"
    (lifecycle,) = one(
        run, "aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration"
    ).inputs["rules"]
    assert lifecycle["status"] == "Enabled"
    assert lifecycle["noncurrentVersionExpiration"]["noncurrentDays"] == NONCURRENT_VERSION_DAYS
    assert run.outputs["checkpoint_uri"] == f"s3://{bucket.state['bucket']}/checkpoints"


def test_repository_scans_on_push_and_keeps_tags_immutable():
    repository = one(run_stack(), "aws:ecr/repository:Repository").inputs
    assert repository["imageTagMutability"] == "IMMUTABLE"
    assert repository["imageScanningConfiguration"] == {"scanOnPush": True}


def test_log_group_per_stack_with_configured_retention():
    run = run_stack(logRetentionDays=14)
    group = training_log_group(run).inputs
    assert group["name"] == "/gpu-training/gpu-training-stack-test"
    assert group["retentionInDays"] == 14
    assert run.outputs["log_group"] == group["name"]


def test_image_tag_defaults_to_the_variant_release_tag_and_can_be_pinned():
    default = run_stack()
    # images/matrix.toml: release 0.1.0, torch 2.13.0, CUDA 13.0 (a100x8's variant), Python 3.12.
    assert default.outputs["image_uri"].endswith(":0.1.0-torch2.13.0-cu130-py3.12")
    repository = one(default, "aws:ecr/repository:Repository").state["repositoryUrl"]
    assert default.outputs["image_uri"].startswith(repository + ":")
    pinned = run_stack(imageTag="my-experiment-7")
    assert pinned.outputs["image_uri"].endswith(":my-experiment-7")


def test_a_digest_makes_the_nodes_pull_exactly_that_image():
    digest = "sha256:" + "5d" * 32
    run = run_stack(imageDigest=digest)
    repository = one(run, "aws:ecr/repository:Repository").state["repositoryUrl"]
    assert run.outputs["image_uri"] == f"{repository}:0.1.0-torch2.13.0-cu130-py3.12@{digest}"


BUCKET = "aws:s3/bucket:Bucket"
REPOSITORY = "aws:ecr/repository:Repository"


def test_by_default_destroy_keeps_the_bucket_and_repository_as_they_are():
    """S3 and ECR refuse to delete a bucket or repository with data: destroy leaves them."""
    run = run_stack()
    assert not one(run, BUCKET).inputs.get("forceDestroy")
    assert not one(run, REPOSITORY).inputs.get("forceDelete")
    kept = {r.name for r in run.resources if r.type.startswith(("aws:s3/", "aws:ecr/"))}
    assert kept and kept <= run.retain_on_delete_names
    bucket = one(run, BUCKET).state["bucket"]
    assert run.outputs["kept_on_destroy"] == [
        f"s3://{bucket}",
        one(run, REPOSITORY).state["repositoryUrl"],
    ]


def test_delete_data_on_destroy_empties_bucket_and_repository():
    run = run_stack(deleteDataOnDestroy=True)
    assert one(run, BUCKET).inputs["forceDestroy"] is True
    assert one(run, REPOSITORY).inputs["forceDelete"] is True
    assert not run.retain_on_delete_names
    assert run.outputs["kept_on_destroy"] == []


def test_the_bucket_denies_every_request_without_tls():
    run = run_stack()
    policy = one(run, "aws:s3/bucketPolicy:BucketPolicy").inputs
    bucket = one(run, BUCKET)
    assert policy["bucket"] == bucket.id
    (statement,) = json.loads(policy["policy"])["Statement"]
    assert (statement["Effect"], statement["Principal"], statement["Action"]) == (
        "Deny",
        "*",
        "s3:*",
    )
    arn = bucket.state["arn"]
    assert statement["Resource"] == [arn, f"{arn}/*"]
    assert statement["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
