"""`jobs [STACK]`: every job of a running stack: state, step, loss, rate, start, GPU-hours, cost.

On a single-node stack, the jobs of the spool (infra/jobs/spool.py) with the node's word
on each; on a Slurm cluster, the queue as squeue lists it. Each job's progress is the
status.json the trainer keeps beside its checkpoints (a prefix per job name).
"""

from __future__ import annotations

import argparse
import datetime

from infra.commands import head_node, workspace
from infra.commands.checkpoints import job_status
from infra.commands.job_target import job_target
from infra.jobs import spool
from infra.report import format_table

# SINCE: when the job took its state (started, yielded, ended; submitted while queued).
COLUMNS = ("JOB", "STATE", "STEP", "LOSS", "RATE", "SINCE", "GPU-HOURS", "COST")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    workspace.add_stack_argument(parser)


def run(args: argparse.Namespace) -> str:
    """Each job's name, state, step, loss, rate, start, GPU-hours and cost so far."""
    target = job_target(workspace.stack_name(args))
    s3 = workspace.aws("s3", target.stack.region)
    if target.is_cluster:
        listed = [
            (job.name, f"{job.state.lower()} (slurm {job.id}, {job.elapsed})", None)
            for job in head_node.queue(target.stack)
        ]
    else:
        listed = [
            (job.spec.name, str(job.state), job.since)
            for job in spool.spool_jobs(s3, target.bucket)
        ]
    if not listed:
        return (
            f"no job on {target.stack.name}: start one with "
            f"`python -m infra run {target.stack.name} --config JOB.toml`"
        )
    return format_table(
        COLUMNS,
        [
            _row(name, state, job_status(s3, target.run_uri(name)), since)
            for name, state, since in listed
        ],
    )


def _row(
    name: str, state: str, status: dict | None, since: datetime.datetime | None
) -> tuple[str, ...]:
    started = f"{since.astimezone(datetime.UTC):%Y-%m-%d %H:%M} UTC" if since else "-"
    if status is None:
        return (name, state, "-", "-", "-", started, "-", "-")
    unit = status.get("unit", "tokens")
    cost = status.get("usd")
    return (
        name,
        state,
        f"{status['step']:,}/{status['total_steps']:,}",
        f"{status['loss']:.4f}",
        f"{status['tokens_per_s']:,.0f} {unit}/s",
        started,
        f"{status['gpu_hours']:.2f}" if "gpu_hours" in status else "-",
        f"${cost:,.2f}" if cost is not None else "-",
    )
