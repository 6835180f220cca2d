"""The nodes' instance role: exactly what the boot script and the trainer use.

- read and write the stack's own checkpoint bucket (nothing else in S3, except
  read-only access to `gpu:dataS3Uri` when set);
- pull from the stack's own ECR repository;
- write container logs to the stack's own log group;
- publish GPU metrics into the guardrails' CloudWatch namespace (the idle alarm);
- read the stack's HF_TOKEN secret, and no other secret (infra/jobs/hf_token.py);
- AmazonSSMManagedInstanceCore, so Session Manager replaces SSH.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_aws as aws

from infra.config.schema import S3Uri
from infra.jobs import hf_token
from infra.node.agent import agent_policy_statement

SSM_MANAGED_POLICY = "arn:aws:iam::aws:policy/AmazonSSMManagedInstanceCore"
EC2_PRINCIPAL = "ec2.amazonaws.com"


@dataclass(frozen=True)
class Account:
    """Where a component's resources live, looked up through its own provider."""

    partition: pulumi.Output[str]  # "aws", "aws-cn", "aws-us-gov"
    region: pulumi.Output[str]
    account_id: pulumi.Output[str]

    @classmethod
    def of(cls, component: pulumi.Resource) -> Account:
        lookup = pulumi.InvokeOutputOptions(parent=component)
        caller = aws.get_caller_identity_output(opts=lookup)
        return cls(
            partition=caller.arn.apply(lambda arn: arn.split(":")[1]),
            region=aws.get_region_output(opts=lookup).region,
            account_id=caller.account_id,
        )


def trust_policy(service: str, account: str | None = None) -> dict[str, Any]:
    """Only `service` may assume the role; with `account`, only while acting for this account
    (aws:SourceAccount guards against the confused deputy, IAM User Guide, "The confused
    deputy problem": https://docs.aws.amazon.com/IAM/latest/UserGuide/confused-deputy.html)."""
    statement: dict[str, Any] = {
        "Effect": "Allow",
        "Principal": {"Service": service},
        "Action": "sts:AssumeRole",
    }
    if account is not None:
        statement["Condition"] = {"StringEquals": {"aws:SourceAccount": account}}
    return {"Version": "2012-10-17", "Statement": [statement]}


def service_role(
    name: str,
    service: str,
    description: str,
    account: pulumi.Output[str],
    tags: dict[str, str],
    opts: pulumi.ResourceOptions,
) -> aws.iam.Role:
    """A role only `service`, acting for `account`, may assume."""
    return aws.iam.Role(
        name,
        description=description,
        assume_role_policy=account.apply(lambda acct: json.dumps(trust_policy(service, acct))),
        tags=tags,
        opts=opts,
    )


def instance_policy(
    bucket_arn: str,
    repository_arn: str,
    log_group_arn: str,
    data: S3Uri | None = None,
    alert_topic_arn: str | None = None,
    hf_token_secret: str | None = None,
) -> dict:
    """The inline policy document, as a dict (the role gets it as JSON); `hf_token_secret`:
    the name of the stack's HF_TOKEN secret, which the nodes read at each job's start."""
    statements = [
        {
            "Sid": "CheckpointBucket",
            "Effect": "Allow",
            "Action": ["s3:ListBucket", "s3:GetBucketLocation"],
            "Resource": [bucket_arn],
        },
        {
            "Sid": "CheckpointObjects",
            "Effect": "Allow",
            "Action": [
                "s3:GetObject",
                "s3:PutObject",
                "s3:DeleteObject",
                "s3:AbortMultipartUpload",
                "s3:ListMultipartUploadParts",
            ],
            "Resource": [f"{bucket_arn}/*"],
        },
        {
            "Sid": "PullTrainingImage",
            "Effect": "Allow",
            "Action": [
                "ecr:BatchGetImage",
                "ecr:GetDownloadUrlForLayer",
                "ecr:BatchCheckLayerAvailability",
            ],
            "Resource": [repository_arn],
        },
        {
            # GetAuthorizationToken is account-wide: ECR does not accept a resource
            # ARN for it, so "*" is the only value that works. It grants a login
            # token, not access: pulls still need the repository statement above.
            "Sid": "EcrLogin",
            "Effect": "Allow",
            "Action": ["ecr:GetAuthorizationToken"],
            "Resource": ["*"],
        },
        {
            "Sid": "ContainerLogs",
            "Effect": "Allow",
            "Action": ["logs:CreateLogStream", "logs:PutLogEvents", "logs:DescribeLogStreams"],
            "Resource": [log_group_arn, f"{log_group_arn}:*"],
        },
        # GPU utilisation for the idle alarm, into the guardrails' metric namespace only.
        {"Sid": "GpuMetrics", **agent_policy_statement()},
    ]
    if alert_topic_arn is not None:
        # A node that fails its health gate says why on the alert topic, then stops.
        statements.append(
            {
                "Sid": "HealthAlerts",
                "Effect": "Allow",
                "Action": ["sns:Publish"],
                "Resource": [alert_topic_arn],
            }
        )
    if hf_token_secret is not None:
        statements.append(
            {
                "Sid": "HuggingFaceToken",
                "Effect": "Allow",
                "Action": ["secretsmanager:GetSecretValue"],
                "Resource": [hf_token.secret_arn(log_group_arn, hf_token_secret)],
            }
        )
    if data is not None:
        data_bucket = f"arn:aws:s3:::{data.bucket}"
        statements += [
            {
                "Sid": "TrainingDataList",
                "Effect": "Allow",
                "Action": ["s3:ListBucket"],
                "Resource": [data_bucket],
                "Condition": {"StringLike": {"s3:prefix": [_prefix_pattern(data.prefix)]}},
            },
            {
                "Sid": "TrainingDataRead",
                "Effect": "Allow",
                "Action": ["s3:GetObject"],
                "Resource": [f"{data_bucket}/{_prefix_pattern(data.prefix)}"],
            },
        ]
    return {"Version": "2012-10-17", "Statement": statements}


def _prefix_pattern(prefix: str) -> str:
    return f"{prefix}/*" if prefix else "*"


@dataclass(frozen=True)
class InstanceRoleArgs:
    bucket_arn: pulumi.Input[str]
    repository_arn: pulumi.Input[str]
    log_group_arn: pulumi.Input[str]
    data: S3Uri | None  # training data the nodes may read
    alert_topic_arn: pulumi.Input[str] | None = None  # the health gate's alerts


class InstanceRole(pulumi.ComponentResource):
    """IAM role + instance profile for the training nodes."""

    role_name: pulumi.Output[str]
    instance_profile_arn: pulumi.Output[str]

    def __init__(
        self,
        name: str,
        args: InstanceRoleArgs,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("gpu:infra:InstanceRole", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        role = aws.iam.Role(
            f"{name}-node",
            description="GPU training nodes: own bucket, own repository, own log group, SSM",
            assume_role_policy=json.dumps(trust_policy(EC2_PRINCIPAL)),
            opts=child,
        )
        aws.iam.RolePolicy(
            f"{name}-node",
            role=role.id,
            policy=pulumi.Output.all(
                args.bucket_arn, args.repository_arn, args.log_group_arn, args.alert_topic_arn
            ).apply(
                lambda arns: json.dumps(
                    instance_policy(
                        *arns[:3],
                        data=args.data,
                        alert_topic_arn=arns[3],
                        hf_token_secret=hf_token.secret_name(name),
                    )
                )
            ),
            opts=child,
        )
        aws.iam.RolePolicyAttachment(
            f"{name}-ssm", role=role.name, policy_arn=SSM_MANAGED_POLICY, opts=child
        )
        profile = aws.iam.InstanceProfile(f"{name}-node", role=role.name, opts=child)
        self.role_name = role.name
        self.instance_profile_arn = profile.arn
        self.register_outputs(
            {"role_name": self.role_name, "instance_profile_arn": self.instance_profile_arn}
        )
