"""`jobs [STACK]`: every job of a running stack: state, step, loss, rate, start, GPU-hours, cost.

The stack's target (infra/targets/) lists them: the job spool a single node reads (and,
under the table, why a failed job failed), or a Slurm cluster's queue. Each job's progress is the
status.json the trainer keeps beside its checkpoints (a prefix per job name).
"""

from __future__ import annotations

import argparse
import datetime

from infra import targets
from infra.deployed import ledger_spend, workspace
from infra.report import format_table
from training.contract import RUN_SPANS_FIELD, RUN_USD_FIELD

# SINCE: when the job took its state (started, yielded, ended; submitted while queued).
COLUMNS = ("JOB", "STATE", "STEP", "LOSS", "RATE", "SINCE", "GPU-HOURS", "COST")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    workspace.add_stack_argument(parser)


def run(args: argparse.Namespace) -> str:
    """Each job's name, state, step, loss, rate, start, GPU-hours and cost so far."""
    target = targets.target(workspace.stack_name(args))
    listing = target.jobs()
    if not listing.jobs:
        return "\n".join(
            [
                f"no job on {target.stack.name}: start one with "
                f"`python -m infra run {target.stack.name} --config JOB.toml`",
                *listing.notes,
            ]
        )
    statuses = [
        (job.name, job.state, target.job_status(job.name), job.since) for job in listing.jobs
    ]
    notes, spend_over = listing.notes, listing.spend_over
    table = format_table(
        COLUMNS,
        [
            _row(name, state, status, since, _cost(status, spend_over))
            for name, state, status, since in statuses
        ],
    )
    return "\n\n".join([table, "\n".join(notes)]) if notes else table


def _cost(status: dict | None, spend_over) -> float | None:
    """The job's cost so far: with a spend reader (a target where one job holds the stack at
    a time, with a ledger), the stack's spend over each start of the job; otherwise the
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
