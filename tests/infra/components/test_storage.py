"""Storage: private encrypted versioned checkpoint bucket, immutable scanned repository, logs."""

from __future__ import annotations

from infra.components.storage import NONCURRENT_VERSION_DAYS
from infra.knowledge.profiles import resolve_profile
from tests.support.stack_runs import run_stack, training_log_group


def test_checkpoint_bucket_is_private_encrypted_versioned_and_expires_old_versions():
    run = run_stack()
    bucket = run.one("aws:s3/bucket:Bucket")
    block = run.one("aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock").inputs
    assert block["bucket"] == bucket.id
    for key in (
        "blockPublicAcls",
        "blockPublicPolicy",
        "ignorePublicAcls",
        "restrictPublicBuckets",
    ):
        assert block[key] is True, key
    (rule,) = run.one(
        "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration"
    ).inputs["rules"]
    assert rule["applyServerSideEncryptionByDefault"]["sseAlgorithm"] == "AES256"
    versioning = run.one("aws:s3/bucketVersioning:BucketVersioning").inputs
    assert versioning["versioningConfiguration"]["status"] == "Enabled"
    (lifecycle,) = run.one(
        "aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration"
    ).inputs["rules"]
    assert lifecycle["status"] == "Enabled"
    assert lifecycle["noncurrentVersionExpiration"]["noncurrentDays"] == NONCURRENT_VERSION_DAYS
    assert run.outputs["checkpoint_uri"] == f"s3://{bucket.state['bucket']}/checkpoints"


def test_repository_scans_on_push_and_keeps_tags_immutable():
    repository = run_stack().one("aws:ecr/repository:Repository").inputs
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
    assert default.outputs["image_uri"].endswith(f":{resolve_profile('a100x8').image_tag}")
    repository = default.one("aws:ecr/repository:Repository").state["repositoryUrl"]
    assert default.outputs["image_uri"].startswith(repository + ":")
    pinned = run_stack(imageTag="my-experiment-7")
    assert pinned.outputs["image_uri"].endswith(":my-experiment-7")
