"""`jobs [STACK]`: every job of a running stack: state, step, loss, rate, start, GPU-hours, cost.

On a single-node stack, the jobs of the spool (infra/jobs/spool.py) with the node's word
on each (and, under the table, why a failed job failed and which spool objects are not
jobs); on a Slurm cluster, the queue as squeue lists it. Each job's progress is the
status.json the trainer keeps beside its checkpoints (a prefix per job name).
"""

from __future__ import annotations

import argparse
import datetime

from infra.commands import head_node, ledger_spend, workspace
from infra.commands.checkpoints import job_status
from infra.commands.job_target import job_target
from infra.jobs import spool
from infra.report import format_table
from training.contract import RUN_SPANS_FIELD, RUN_USD_FIELD

# SINCE: when the job took its state (started, yielded, ended; submitted while queued).
COLUMNS = ("JOB", "STATE", "STEP", "LOSS", "RATE", "SINCE", "GPU-HOURS", "COST")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    workspace.add_stack_argument(parser)


def run(args: argparse.Namespace) -> str:
    """Each job's name, state, step, loss, rate, start, GPU-hours and cost so far."""
    target = job_target(workspace.stack_name(args))
    s3 = workspace.aws("s3", target.stack.region)
    notes = []  # under the table: why jobs failed, spool objects that are not jobs
    if target.is_cluster:
        listed = [
            (job.name, f"{job.state.lower()} (slurm {job.id}, {job.elapsed})", None)
            for job in head_node.queue(target.stack)
        ]
    else:
        contents = spool.read_spool(s3, target.bucket)
        listed = [(job.spec.name, str(job.state), job.since) for job in contents.jobs]
        notes += [
            f"job {job.spec.name} failed: {job.reason}" for job in contents.jobs if job.reason
        ]
        notes += [f"skipped {what}" for what in contents.skipped]
    if not listed:
        return "\n".join(
            [
                f"no job on {target.stack.name}: start one with "
                f"`python -m infra run {target.stack.name} --config JOB.toml`",
                *notes,
            ]
        )
    statuses = [
        (name, state, job_status(s3, target.run_uri(name)), since) for name, state, since in listed
    ]
    # A cluster's ledger counts every job's nodes together: its jobs keep the trainer's figure.
    spend_over = (
        ledger_spend.spend_reader(target.stack)
        if not target.is_cluster and target.stack.outputs.spend_ledger_table
        else None
    )
    table = format_table(
        COLUMNS,
        [
            _row(name, state, status, since, _cost(status, spend_over))
            for name, state, status, since in statuses
        ],
    )
    return "\n\n".join([table, "\n".join(notes)]) if notes else table


def _cost(status: dict | None, spend_over) -> float | None:
    """The job's cost so far: with a spend reader (a single-node stack with a ledger, one job
    holding the node at a time), the stack's spend over each start of the job; otherwise the
    trainer's figure (its wall time at the stack's $/h)."""
    if status is None:
        return None
    if spend_over is None or RUN_SPANS_FIELD not in status:
        return status.get(RUN_USD_FIELD)
    return spend_over(ledger_spend.spans_from(status[RUN_SPANS_FIELD]))


def _row(
    name: str,
    state: str,
    status: dict | None,
    since: datetime.datetime | None,
    cost: float | None,
) -> tuple[str, ...]:
    started = f"{since.astimezone(datetime.UTC):%Y-%m-%d %H:%M} UTC" if since else "-"
    if status is None:
        return (name, state, "-", "-", "-", started, "-", "-")
    unit = status.get("unit", "tokens")
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
