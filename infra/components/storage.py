"""Where the stack keeps what outlives its nodes: checkpoints, images and logs.

- An S3 bucket for checkpoints: private (public access blocked), encrypted,
  versioned so an overwritten checkpoint can be recovered, with noncurrent
  versions expiring so that versioning does not double the bill forever.
- An ECR repository for the training image: scanned on push, immutable tags (a
  tag names one image, so a resumed job runs the code it started with).
- A CloudWatch Logs group for the containers' output, with a retention period.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

CHECKPOINT_PREFIX = "checkpoints"
NONCURRENT_VERSION_DAYS = 7
ABORT_MULTIPART_DAYS = 2


@dataclass(frozen=True)
class StorageArgs:
    log_retention_days: int
    # True: destroy deletes the bucket's objects (every version) and the repository's images.
    # False: destroy leaves bucket and repository, with their settings, in the account.
    delete_data_on_destroy: bool = False


def tls_only_policy(bucket_arn: str) -> dict:
    """Deny any access to the bucket and its objects over plain HTTP."""
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "DenyInsecureTransport",
                "Effect": "Deny",
                "Principal": "*",
                "Action": "s3:*",
                "Resource": [bucket_arn, f"{bucket_arn}/*"],
                "Condition": {"Bool": {"aws:SecureTransport": "false"}},
            }
        ],
    }


class Storage(pulumi.ComponentResource):
    """Checkpoint bucket, image repository and log group."""

    bucket_name: pulumi.Output[str]
    bucket_arn: pulumi.Output[str]
    checkpoint_uri: pulumi.Output[str]
    repository_arn: pulumi.Output[str]
    repository_url: pulumi.Output[str]
    log_group_name: pulumi.Output[str]
    log_group_arn: pulumi.Output[str]

    def __init__(
        self,
        name: str,
        args: StorageArgs,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("gpu:infra:Storage", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        # S3 deletes only an empty bucket (a versioned one: no object versions left) and ECR
        # only an empty repository (S3 User Guide, "Deleting a bucket"; ECR DeleteRepository:
        # RepositoryNotEmptyException). Either they are emptied on destroy (force_destroy,
        # force_delete) or destroy leaves them, with every setting, for the user to keep.
        delete_data = args.delete_data_on_destroy
        data = pulumi.ResourceOptions(parent=self, retain_on_delete=not delete_data)

        bucket = _checkpoint_bucket(f"{name}-checkpoints", delete_data, data)

        repository = aws.ecr.Repository(
            f"{name}-images",
            image_tag_mutability="IMMUTABLE",
            image_scanning_configuration={"scan_on_push": True},
            encryption_configurations=[{"encryption_type": "AES256"}],
            force_delete=delete_data,
            opts=data,
        )

        log_group = aws.cloudwatch.LogGroup(
            f"{name}-training",
            name=f"/gpu-training/{name}",
            retention_in_days=args.log_retention_days,
            opts=child,
        )

        self.bucket_name = bucket.bucket
        self.bucket_arn = bucket.arn
        self.checkpoint_uri = bucket.bucket.apply(lambda b: f"s3://{b}/{CHECKPOINT_PREFIX}")
        self.repository_arn = repository.arn
        self.repository_url = repository.repository_url
        self.log_group_name = log_group.name
        self.log_group_arn = log_group.arn
        self.register_outputs(
            {
                "bucket_name": self.bucket_name,
                "checkpoint_uri": self.checkpoint_uri,
                "repository_url": self.repository_url,
                "log_group_name": self.log_group_name,
            }
        )


def _checkpoint_bucket(name: str, delete_data: bool, data: pulumi.ResourceOptions) -> aws.s3.Bucket:
    """Private, encrypted, versioned, TLS only; old checkpoint versions expire."""
    bucket = aws.s3.Bucket(name, force_destroy=delete_data, opts=data)
    aws.s3.BucketPublicAccessBlock(
        name,
        bucket=bucket.id,
        block_public_acls=True,
        block_public_policy=True,
        ignore_public_acls=True,
        restrict_public_buckets=True,
        opts=data,
    )
    aws.s3.BucketServerSideEncryptionConfiguration(
        name,
        bucket=bucket.id,
        rules=[{"apply_server_side_encryption_by_default": {"sse_algorithm": "AES256"}}],
        opts=data,
    )
    versioning = aws.s3.BucketVersioning(
        name,
        bucket=bucket.id,
        versioning_configuration={"status": "Enabled"},
        opts=data,
    )
    aws.s3.BucketLifecycleConfiguration(
        name,
        bucket=bucket.id,
        rules=[
            {
                "id": "expire-old-checkpoint-versions",
                "status": "Enabled",
                "filter": {},
                "noncurrent_version_expiration": {"noncurrent_days": NONCURRENT_VERSION_DAYS},
                "abort_incomplete_multipart_upload": {
                    "days_after_initiation": ABORT_MULTIPART_DAYS
                },
            }
        ],
        # S3 wants versioning configured before a noncurrent-version rule.
        opts=pulumi.ResourceOptions.merge(data, pulumi.ResourceOptions(depends_on=[versioning])),
    )
    # TLS only: deny every request that does not use HTTPS (S3 User Guide, "Security best
    # practices for Amazon S3": aws:SecureTransport,
    # https://docs.aws.amazon.com/AmazonS3/latest/userguide/security-best-practices.html).
    aws.s3.BucketPolicy(
        name,
        bucket=bucket.id,
        policy=bucket.arn.apply(lambda arn: json.dumps(tls_only_policy(arn))),
        opts=data,
    )
    return bucket
