"""`cancel STACK JOB`: stop a job with a final checkpoint; it leaves the queue.

On a single-node stack the request is a `cancel` object in the job spool: the node's
watcher stops the container (the trainer checkpoints on SIGTERM and exits 75) and marks
the job cancelled; a job not started yet is marked cancelled at once. On a Slurm cluster,
`scancel --full` on the head node (infra/cluster/jobs.py). Either way this waits for the
stop and prints the step and checkpoint the trainer reported. `run` with the same name
later resumes from that checkpoint.
"""

from __future__ import annotations

import argparse
import datetime
import time
from collections.abc import Callable

from infra.cluster import jobs as slurm
from infra.cluster.control import STOP_WAIT_S
from infra.commands import head_node, workspace
from infra.commands.checkpoints import stop_report
from infra.commands.job_target import job_target
from infra.errors import ConfigError
from infra.jobs import spool
from infra.jobs.spool import JobState

# The watcher's poll, then the trainer's checkpoint and exit (the unit's docker stop
# grace is 100 s: infra/node/templates/gpu-training.service).
CANCEL_WAIT_S = spool.POLL_S + 150


def add_arguments(parser: argparse.ArgumentParser) -> None:
    workspace.add_stack_argument(parser)
    parser.add_argument("job", help="the job's name, as `jobs` lists it")


def run(
    args: argparse.Namespace,
    *,
    sleep: Callable[[float], None] = time.sleep,
    now: Callable[[], float] = time.monotonic,
) -> str:
    """Stop a job with a final checkpoint; it leaves the queue (`run` again resumes it)."""
    name = spool.check_name(args.job)
    target = job_target(workspace.stack_name(args))
    s3 = workspace.aws("s3", target.stack.region)
    asked = datetime.datetime.now(datetime.UTC)
    if target.is_cluster:
        ids = head_node.on_head_node(
            target.stack,
            slurm.cancel_script(name),
            what=f"cancel job {name}",
            timeout_s=STOP_WAIT_S + 60,
            sleep=sleep,
        ).split()
        report = stop_report(s3, target.run_uri(name), asked)
        return f"job {name} (slurm {', '.join(ids)}) cancelled: {report}"
    found = spool.find_job(s3, target.bucket, name)
    if found is None:
        raise ConfigError(
            f"no job {name!r} on {target.stack.name}: "
            f"`python -m infra jobs {target.stack.name}` lists them"
        )
    if found.state not in (JobState.QUEUED, JobState.RUNNING, JobState.YIELDED):
        return f"job {name} is already {found.state}: nothing to cancel"
    spool.request_cancel(s3, target.bucket, name)
    deadline = now() + CANCEL_WAIT_S
    while True:
        found = spool.find_job(s3, target.bucket, name)
        if found is not None and found.state == JobState.CANCELLED:
            return f"job {name} cancelled: {stop_report(s3, target.run_uri(name), asked)}"
        if now() >= deadline:
            return (
                f"job {name}: cancel requested, not yet done after {CANCEL_WAIT_S} s (the "
                f"node may be stopped); `python -m infra jobs {target.stack.name}` shows when"
            )
        sleep(spool.POLL_S / 2)
