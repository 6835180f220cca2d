"""A mistake in the machine's setup, told in one line with its fix instead of a traceback.

The command lines (infra/cli.py, training/cli.py) pass an exception they did not expect
through `explain`; what it recognises (Pulumi not logged in, an AWS profile that does not
exist, no network, a folder that cannot be written, a full disk) becomes one sentence and
exit 2, everything else stays a bug with its traceback. Pulumi and botocore are looked up
only when already imported: this module imports neither.
"""

from __future__ import annotations

import errno
import os
import re
import sys

# The ways `pulumi login` can keep state (Pulumi docs, "State and backends",
# https://www.pulumi.com/docs/iac/concepts/state-and-backends/); README, "Pulumi state".
PULUMI_LOGIN = (
    "run `pulumi login` (Pulumi Cloud, free for one person), `pulumi login --local` (state "
    "in ~/.pulumi on this machine) or `pulumi login s3://BUCKET` (state in your own bucket)"
)
# What the Pulumi CLI prints without a backend: "PULUMI_ACCESS_TOKEN must be set for login
# during non-interactive CLI sessions" (pulumi/pulumi, pkg/cmd/pulumi; seen in
# pulumi/pulumi#13293), or an expired/invalid token's "pulumi login".
_NOT_LOGGED_IN = re.compile(r"PULUMI_ACCESS_TOKEN|pulumi login|not logged in|invalid access token")


def explain(error: BaseException) -> str | None:
    """One line (what is wrong: the fix) for a setup mistake, None for anything else."""
    parts = problem_and_fix(error)
    return None if parts is None else f"{parts[0]}: {parts[1]}"


def problem_and_fix(error: BaseException) -> tuple[str, str] | None:
    """(what is wrong, the fix) for a setup mistake, None for anything else."""
    for check in (_pulumi, _aws, _disk):
        parts = check(error)
        if parts is not None:
            return parts
    return None


def _pulumi(error: BaseException) -> tuple[str, str] | None:
    automation = sys.modules.get("pulumi.automation")
    if automation is None or not isinstance(error, automation.CommandError):
        return None
    text = str(error)
    if _NOT_LOGGED_IN.search(text):
        return "the Pulumi CLI is not logged in to a state backend", PULUMI_LOGIN
    said = [line.strip() for line in text.splitlines() if line.strip().startswith("error:")]
    reason = said[0].removeprefix("error:").strip() if said else text.strip().splitlines()[0]
    return (
        f"the Pulumi CLI failed ({reason})",
        "`pulumi whoami` and `pulumi stack ls` show its state",
    )


def _aws(error: BaseException) -> tuple[str, str] | None:
    botocore = sys.modules.get("botocore.exceptions")
    if botocore is None:
        return None
    if isinstance(error, botocore.ProfileNotFound):
        profile = error.kwargs.get("profile", "?")
        return (
            f"AWS profile {profile!r} (AWS_PROFILE) is not in ~/.aws/config",
            "correct the name (`aws configure list-profiles` lists them) or create it with "
            f"`aws configure --profile {profile}`",
        )
    if isinstance(error, botocore.NoCredentialsError):
        return (
            "no AWS credentials found",
            "run `aws configure` (or `aws sso login`), or set AWS_PROFILE",
        )
    if isinstance(error, (botocore.EndpointConnectionError, botocore.ConnectTimeoutError)):
        where = error.kwargs.get("endpoint_url", "AWS")
        return (
            f"no network: cannot reach {where}",
            "check this machine's connection (and HTTPS_PROXY if it needs one), then try again",
        )
    if isinstance(error, (botocore.SSOError, botocore.TokenRetrievalError)):
        return f"the AWS login has expired ({error})", "run `aws sso login`, then this again"
    return None


def _disk(error: BaseException) -> tuple[str, str] | None:
    if not isinstance(error, OSError):
        return None
    where = error.filename or "the output folder"
    if error.errno == errno.ENOSPC:
        return (
            f"no space left on the disk holding {where}",
            "free some space there, or point TRAIN_OUTPUT_DIR (and TRAIN_CHECKPOINT_DIR) at a "
            "disk with room",
        )
    if error.errno in (errno.EACCES, errno.EROFS, errno.EPERM) or (
        error.errno == errno.ENOENT and _under_home(where)
    ):
        return (
            f"cannot write {where} ({error.strerror})",
            "make it writable, or set HOME (and XDG_CACHE_HOME) to a folder you can write",
        )
    return None


def _under_home(path: object) -> bool:
    home = os.path.expanduser("~")
    return isinstance(path, str) and (path == home or path.startswith(home.rstrip("/") + "/"))
