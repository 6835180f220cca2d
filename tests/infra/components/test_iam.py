"""The instance role: its own bucket, repository and log group; SSM; read-only training data."""

from __future__ import annotations

from infra.components.iam import SSM_MANAGED_POLICY, instance_policy
from infra.config.schema import S3Uri
from infra.jobs import hf_token
from tests.support.mock_runs import of_type, one
from tests.support.stack_runs import node_policy, run_stack

BUCKET = "arn:aws:s3:::stack-checkpoints"
REPO = "arn:aws:ecr:us-east-1:123456789012:repository/stack-images"
LOGS = "arn:aws:logs:us-east-1:123456789012:log-group:/gpu-training/stack"


def by_sid(policy: dict) -> dict[str, dict]:
    return {statement["Sid"]: statement for statement in policy["Statement"]}


def test_checkpoints_read_write_in_own_bucket_only():
    statements = by_sid(instance_policy(BUCKET, REPO, LOGS))
    assert statements["CheckpointBucket"]["Resource"] == [BUCKET]
    assert statements["CheckpointObjects"]["Resource"] == [f"{BUCKET}/*"]
    assert {"s3:GetObject", "s3:PutObject", "s3:DeleteObject"} <= set(
        statements["CheckpointObjects"]["Action"]
    )


def test_pull_only_from_own_repository_and_log_only_to_own_group():
    statements = by_sid(instance_policy(BUCKET, REPO, LOGS))
    assert statements["PullTrainingImage"]["Resource"] == [REPO]
    assert not any("Put" in a or "Upload" in a for a in statements["PullTrainingImage"]["Action"])
    assert statements["EcrLogin"] == statements["EcrLogin"] | {
        "Action": ["ecr:GetAuthorizationToken"],
        "Resource": ["*"],
    }
    assert statements["ContainerLogs"]["Resource"] == [LOGS, f"{LOGS}:*"]


def test_no_data_statement_without_a_data_uri():
    assert not any(
        sid.startswith("TrainingData") for sid in by_sid(instance_policy(BUCKET, REPO, LOGS))
    )


def test_the_nodes_read_their_stacks_hf_token_secret_and_no_other():
    policy = instance_policy(BUCKET, REPO, LOGS, hf_token_secret="gpu-stack/p-s/hf-token")
    assert by_sid(policy)["HuggingFaceToken"] == {
        "Sid": "HuggingFaceToken",
        "Effect": "Allow",
        "Action": ["secretsmanager:GetSecretValue"],
        # Secrets Manager adds "-" and six characters to the name in the ARN.
        "Resource": [
            "arn:aws:secretsmanager:us-east-1:123456789012:secret:gpu-stack/p-s/hf-token-??????"
        ],
    }
    others = [s for s in policy["Statement"] if s["Sid"] != "HuggingFaceToken"]
    assert not any("secretsmanager" in str(s["Action"]) for s in others)


def test_training_data_is_read_only_under_its_prefix():
    statements = by_sid(
        instance_policy(BUCKET, REPO, LOGS, data=S3Uri(bucket="corpus", prefix="tokens/v2"))
    )
    assert statements["TrainingDataRead"]["Action"] == ["s3:GetObject"]
    assert statements["TrainingDataRead"]["Resource"] == ["arn:aws:s3:::corpus/tokens/v2/*"]
    listing = statements["TrainingDataList"]
    assert listing["Resource"] == ["arn:aws:s3:::corpus"]
    assert listing["Condition"] == {"StringLike": {"s3:prefix": ["tokens/v2/*"]}}


def test_stack_role_trusts_ec2_and_carries_ssm_core():
    run = run_stack(dataS3Uri="s3://corpus/tokens")
    role = next(r for r in of_type(run, "aws:iam/role:Role") if r.name.endswith("-node"))
    assert '"Service": "ec2.amazonaws.com"' in role.inputs["assumeRolePolicy"]
    attachments = of_type(run, "aws:iam/rolePolicyAttachment:RolePolicyAttachment")
    assert [a.inputs["policyArn"] for a in attachments] == [SSM_MANAGED_POLICY]
    profile = one(run, "aws:iam/instanceProfile:InstanceProfile")
    assert profile.inputs["role"] == role.state["name"]
    statements = by_sid(node_policy(run))
    assert statements["TrainingDataRead"]["Resource"] == ["arn:aws:s3:::corpus/tokens/*"]
    bucket = one(run, "aws:s3/bucket:Bucket").state["arn"]
    assert statements["CheckpointObjects"]["Resource"] == [f"{bucket}/*"]
    logs = statements["ContainerLogs"]["Resource"][0]
    secret = hf_token.secret_name(role.name.removesuffix("-node"))
    assert statements["HuggingFaceToken"]["Resource"] == [hf_token.secret_arn(logs, secret)]
    assert secret.startswith("gpu-stack/") and logs.startswith("arn:aws:logs:")
