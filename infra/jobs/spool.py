"""The job spool: how jobs travel from the command line to a running stack's node.

A node's user data says only where the spool is; what to train travels here, so a new
job, a new price or new code replaces no node (docs/stack.md, "Jobs"). Layout, under the
stack's bucket (the checkpoint bucket, which the node's role may already read and write):

    jobs/<name>/job.json      JobSpec: the training TOML, overrides, price, code archive
    jobs/<name>/code.tar.gz   the `run --code DIR` folder, when there is one
    jobs/<name>/cancel        a cancel request: the node stops the job with a checkpoint
    jobs/<name>/state         the node's word on the job: one of JobState on its first
                              line, then, for a failed job, why; a job.json newer than it
                              makes the job queued again

`python -m infra run|jobs|cancel` write and read it; the node's watcher
(infra/node/templates/watch-jobs.py) reads the same keys, rendered from the names below
by infra/node/boot.py. An object that is not part of a job (a job.json that is not a
JobSpec, a stray key, a state word no node writes) is skipped by both, and reported. A job
name is also the prefix of its checkpoints under the stack's checkpoint URI, so running a
name again resumes that job.
"""

from __future__ import annotations

import datetime
import enum
import re
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError
from pydantic import BaseModel, ConfigDict, ValidationError

from infra.errors import ConfigError

SPOOL_PREFIX = "jobs"
SPEC_NAME = "job.json"
CODE_NAME = "code.tar.gz"
CANCEL_NAME = "cancel"
STATE_NAME = "state"
# How often the node's watcher reads the spool: a new job starts within about this long.
POLL_S = 10
# The stack's gpu:trainConfig, written by `up`: the first job in the spool.
DEFAULT_JOB = "default"
# On a single-node stack each job's output is its own CloudWatch Logs stream in the stack's
# log group (the node's watcher names it; `logs --job NAME` reads it); the node's own boot
# and health-gate lines stay in `node-0`.
JOB_LOG_STREAM_PREFIX = "job-"


def log_stream(name: str) -> str:
    """The CloudWatch Logs stream job `name` writes to on a single-node stack."""
    return f"{JOB_LOG_STREAM_PREFIX}{name}"


# Letters, digits, - and _: a job name is an S3 prefix, a folder on the node and a Slurm
# job name, and lands in shell strings on the node (whose watcher reads it too).
JOB_NAME_PATTERN = "[A-Za-z0-9][A-Za-z0-9_-]{0,62}"
_NAME = re.compile(f"^{JOB_NAME_PATTERN}$")


class JobState(enum.StrEnum):
    """What the node says about a job (its `state` object)."""

    QUEUED = "queued"  # no node has started it yet (no state object)
    RUNNING = "running"
    YIELDED = "yielded"  # checkpointed (exit 75) for a newer job; resumes after it
    DONE = "done"
    CANCELLED = "cancelled"
    FAILED = "failed"


class JobSpec(BaseModel):
    """One job as `run` submits it: what the node's container needs beyond the image."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    config_toml: str  # the training TOML, shipped whole: the node writes it to a file
    overrides: tuple[str, ...] = ()  # `--set k=v` arguments for `python -m training`
    usd_per_hour: float  # the stack's price when submitted: the trainer's summary cost
    has_code: bool = False  # a code.tar.gz sits beside job.json
    submitted_at: datetime.datetime
    # A command job (`run STACK -- COMMAND`): run as `python -m training exec -- COMMAND`
    # (training/command_job.py) instead of the trainer; its config_toml is empty.
    command: tuple[str, ...] = ()

    def trainer_arguments(self) -> list[str]:
        """What follows `python -m training` on every node of the job."""
        if self.command:
            return ["exec", "--", *self.command]
        return [part for override in self.overrides for part in ("--set", override)]


def check_name(name: str, flag: str = "--name") -> str:
    if not _NAME.match(name):
        raise ConfigError(
            f"{flag} {name!r}: a job name is 1 to 63 letters, digits, - or _, starting with "
            "a letter or digit"
        )
    return name


def job_key(name: str, leaf: str) -> str:
    return f"{SPOOL_PREFIX}/{name}/{leaf}"


def submit(s3: Any, bucket: str, spec: JobSpec, code_archive: bytes | None = None) -> None:
    """Put a job in the spool: its code first, so a node that sees job.json finds both.

    A job submitted again under its name starts over as queued: its old state and cancel
    request go, its checkpoints stay (so it resumes)."""
    if code_archive is not None:
        s3.put_object(Bucket=bucket, Key=job_key(spec.name, CODE_NAME), Body=code_archive)
    for leaf in (STATE_NAME, CANCEL_NAME):
        s3.delete_object(Bucket=bucket, Key=job_key(spec.name, leaf))
    s3.put_object(
        Bucket=bucket,
        Key=job_key(spec.name, SPEC_NAME),
        Body=spec.model_dump_json().encode(),
        ContentType="application/json",
    )


def request_cancel(s3: Any, bucket: str, name: str) -> None:
    s3.put_object(Bucket=bucket, Key=job_key(name, CANCEL_NAME), Body=b"")


@dataclass(frozen=True)
class SpooledJob:
    spec: JobSpec
    state: JobState
    since: datetime.datetime  # when the node last set its state (submitted, while queued)
    reason: str = ""  # why the node marked it failed


@dataclass(frozen=True)
class Spool:
    jobs: list[SpooledJob]  # oldest submission first
    skipped: list[str]  # "KEY: why" for each object that is not part of a job


_LEAVES = (SPEC_NAME, CODE_NAME, CANCEL_NAME, STATE_NAME)


def read_spool(s3: Any, bucket: str) -> Spool:
    """Every job in the spool with its state, and the objects that are not part of one."""
    objects: dict[str, dict[str, dict]] = {}  # name -> leaf -> the object's listing
    skipped = []
    for page in s3.get_paginator("list_objects_v2").paginate(
        Bucket=bucket, Prefix=f"{SPOOL_PREFIX}/"
    ):
        for item in page.get("Contents", []):
            name, _, leaf = item["Key"].removeprefix(f"{SPOOL_PREFIX}/").partition("/")
            if _NAME.match(name) and leaf in _LEAVES:
                objects.setdefault(name, {})[leaf] = item
            else:
                skipped.append(f"{item['Key']}: not part of a job")
    jobs = []
    for name, leaves in sorted(objects.items()):
        if SPEC_NAME not in leaves:
            continue  # a job being submitted: its code is there, its job.json not yet
        try:
            spec = JobSpec.model_validate_json(_body(s3, bucket, job_key(name, SPEC_NAME)))
        except ValidationError as error:
            skipped.append(f"{job_key(name, SPEC_NAME)}: not a job ({_first_problem(error)})")
            continue
        state = leaves.get(STATE_NAME)
        # A job.json newer than the node's word is a job sent again (`up` with a changed
        # gpu:trainConfig rewrites the default job's): queued, as the watcher sees it.
        if state is None or state["LastModified"] < leaves[SPEC_NAME]["LastModified"]:
            jobs.append(SpooledJob(spec, JobState.QUEUED, spec.submitted_at))
            continue
        text = _body(s3, bucket, state["Key"]).decode(errors="replace")
        word, _, reason = text.partition("\n")
        try:
            known = JobState(word.strip())
        except ValueError:
            skipped.append(f"{state['Key']}: unknown state {word.strip()!r}")
            continue
        jobs.append(SpooledJob(spec, known, state["LastModified"], reason.strip()))
    return Spool(sorted(jobs, key=lambda job: job.spec.submitted_at), skipped)


def spool_jobs(s3: Any, bucket: str) -> list[SpooledJob]:
    """Every job in the spool with its state, oldest submission first."""
    return read_spool(s3, bucket).jobs


def find_job(s3: Any, bucket: str, name: str) -> SpooledJob | None:
    return next((job for job in spool_jobs(s3, bucket) if job.spec.name == name), None)


def _body(s3: Any, bucket: str, key: str) -> bytes:
    return s3.get_object(Bucket=bucket, Key=key)["Body"].read()


def _first_problem(error: ValidationError) -> str:
    problem = error.errors()[0]
    where = ".".join(str(part) for part in problem["loc"])
    return f"{where}: {problem['msg']}" if where else problem["msg"]


def current_run_uri(s3: Any, checkpoint_uri: str | None) -> str | None:
    """Where a single-node stack's current job keeps its checkpoints and status.json: the
    running job's prefix, else the one whose state changed last; the stack's checkpoint URI
    itself when the spool is empty or unreadable (a stack from before the spool)."""
    if not checkpoint_uri:
        return None
    bucket = checkpoint_uri.removeprefix("s3://").split("/", 1)[0]
    try:
        jobs = spool_jobs(s3, bucket)
    except ClientError:
        return checkpoint_uri
    if not jobs:
        return checkpoint_uri
    running = [job for job in jobs if job.state == JobState.RUNNING]
    current = (running or sorted(jobs, key=lambda job: job.since))[-1]
    return f"{checkpoint_uri.rstrip('/')}/{current.spec.name}"
