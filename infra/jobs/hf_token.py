"""HF_TOKEN, the Hugging Face token a gated or private model needs, from the user's shell to
the stack's containers, written nowhere on the way but in AWS Secrets Manager.

`up` and `run` store HF_TOKEN from the caller's environment, when it is set, as the stack's
secret (one per stack, named after the stack's resource name: `secret_name`). The nodes
read it at each job's start: the single node's job watcher (infra/node/templates/
watch-jobs.py) hands it to `docker run --env HF_TOKEN`, which takes the value from the
watcher's own environment, not from its command line; the Slurm job script
(infra/cluster/templates/train.sbatch) exports it before srun. No user data, job object,
env file or log line holds it. The nodes' role may read this secret and no other
(infra/components/iam.py); `down` deletes it.

Why Secrets Manager, not an SSM SecureString parameter: the nodes' role carries the
AmazonSSMManagedInstanceCore managed policy for Session Manager, which allows
ssm:GetParameter and ssm:GetParameters on every parameter ("Resource": "*":
https://docs.aws.amazon.com/aws-managed-policy/latest/reference/AmazonSSMManagedInstanceCore.html),
so a parameter could not be kept to this stack's nodes; the role has no Secrets Manager
permission but the one statement for this secret.

Secrets Manager facts (API Reference, https://docs.aws.amazon.com/secretsmanager/latest/apireference/):
- CreateSecret fails with ResourceExistsException when the name is taken; PutSecretValue
  then stores a new version, which GetSecretValue returns from then on (AWSCURRENT).
- A secret's ARN is its name, a hyphen and six random characters (CreateSecret, "ARN"), so a
  policy names it as `NAME-??????` (User Guide, "Permissions policy examples":
  https://docs.aws.amazon.com/secretsmanager/latest/userguide/auth-and-access_examples.html).
- DeleteSecret with ForceDeleteWithoutRecovery deletes it at once; without it the name
  stays taken for a recovery window of 7 to 30 days.
- GetSecretValue of a name that does not exist fails with ResourceNotFoundException.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from botocore.exceptions import ClientError

from infra.errors import ConfigError
from training.contract import HF_TOKEN_ENV

_PREFIX = "gpu-stack"


def secret_name(stack_resource: str) -> str:
    """The stack's secret: `stack_resource` is its resource name, `<project>-<stack>` (the
    value of its cost tag)."""
    return f"{_PREFIX}/{stack_resource}/hf-token"


def secret_arn(log_group_arn: str, name: str) -> str:
    """The secret's ARN pattern in the account, partition and region of the stack's log group
    (arn:PARTITION:logs:REGION:ACCOUNT:log-group:...)."""
    partition, _, region, account = log_group_arn.split(":")[1:5]
    return f"arn:{partition}:secretsmanager:{region}:{account}:secret:{name}-??????"


def store(secrets: Any, name: str, environ: Mapping[str, str]) -> str | None:
    """Store HF_TOKEN from `environ` as secret `name`; the line that says so (never the
    token), or None when HF_TOKEN is unset or empty (a stored token stays)."""
    token = environ.get(HF_TOKEN_ENV, "").strip()
    if not token:
        return None
    try:
        try:
            secrets.create_secret(
                Name=name,
                SecretString=token,
                Description="HF_TOKEN for the stack's training jobs (gpu-stack up/run)",
            )
        except ClientError as error:
            if error.response["Error"]["Code"] != "ResourceExistsException":
                raise
            secrets.put_secret_value(SecretId=name, SecretString=token)
    except ClientError as error:
        code = error.response["Error"]["Code"]
        raise ConfigError(
            f"{HF_TOKEN_ENV} is set but could not be stored as the stack's secret {name} "
            f"({code}): allow secretsmanager:CreateSecret and PutSecretValue on it, or unset "
            f"{HF_TOKEN_ENV} for models that are not gated"
        ) from None
    return f"{HF_TOKEN_ENV} stored for the stack's jobs (Secrets Manager secret {name})"


def delete(secrets: Any, name: str) -> bool:
    """Delete the stack's secret at once; False when there was none."""
    try:
        secrets.delete_secret(SecretId=name, ForceDeleteWithoutRecovery=True)
    except ClientError as error:
        if error.response["Error"]["Code"] == "ResourceNotFoundException":
            return False
        raise
    return True
