"""What the trainer leaves beside its checkpoints in the stack's bucket, read for the commands:
the newest committed checkpoint and the job's progress (status.json).

The object names are the trainer's (training/checkpoint/s3.py, checkpointer.py; a test
keeps them equal): the trainer's package needs torch, the command line does not.
"""

from __future__ import annotations

import datetime
import json
from dataclasses import dataclass
from typing import Any

POINTER_NAME = "latest_committed"
STATUS_NAME = "status.json"
# The node's clock is not this machine's, and status.json keeps whole seconds: a stop
# reported up to this long before it was asked (by this clock) is taken as its answer.
CLOCK_SKEW_S = 30


@dataclass(frozen=True)
class Checkpoint:
    tag: str
    written: datetime.datetime

    def describe(self) -> str:
        return f"{self.tag} ({self.written.astimezone(datetime.UTC):%Y-%m-%d %H:%M} UTC)"


def _split(uri: str) -> tuple[str, str]:
    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    return bucket, prefix.strip("/")


def _get(s3: Any, uri: str, name: str) -> dict | None:
    bucket, prefix = _split(uri)
    try:
        return s3.get_object(Bucket=bucket, Key=f"{prefix}/{name}")
    except s3.exceptions.NoSuchKey:
        return None


def last_checkpoint(s3: Any, uri: str | None) -> Checkpoint | None:
    """The checkpoint the S3 pointer names, and when it was written; None before the first."""
    found = _get(s3, uri, POINTER_NAME) if uri else None
    if found is None:
        return None
    return Checkpoint(found["Body"].read().decode().strip(), found["LastModified"])


def job_status(s3: Any, uri: str | None) -> dict | None:
    """The trainer's last status.json (step, loss, tokens/s, time left), None before one."""
    found = _get(s3, uri, STATUS_NAME) if uri else None
    if found is None:
        return None
    try:
        return json.loads(found["Body"].read())
    except ValueError:
        return None


def stop_report(s3: Any, uri: str | None, since: datetime.datetime) -> str:
    """What the trainer said about the stop asked for at `since`: its step and checkpoint."""
    status = job_status(s3, uri)
    if status is None:
        return "the job published no progress (it may not have started): nothing to checkpoint"
    updated = datetime.datetime.fromisoformat(status["updated_at"])
    if status["state"] in ("interrupted", "done") and (
        updated >= since - datetime.timedelta(seconds=CLOCK_SKEW_S)
    ):
        checkpoint = last_checkpoint(s3, uri)
        where = checkpoint.describe() if checkpoint else "no checkpoint in S3"
        return f"the job stopped at step {status['step']:,} ({status['state']}); {where}"
    return (
        f"the job did not report a stop (last status: {status['state']} at step "
        f"{status['step']:,}, {status['updated_at']}): it resumes from its last checkpoint"
    )
