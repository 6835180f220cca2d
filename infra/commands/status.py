"""`status [STACK]`: each node's state, the job's progress, the last checkpoint and the spend.

Nodes from EC2 (read through their spot requests: interrupted, waiting for capacity),
the job from the status.json the trainer keeps beside its checkpoints, spend and
budget from the spend guard's ledger (infra/functions/ledger.py: read_ledger).
A Slurm cluster stack shows its instances by tag and its queue, read on the head node,
with each queued job's progress and checkpoint (infra/commands/head_node.py).
"""

from __future__ import annotations

import argparse
import datetime
import sys
import time
from collections.abc import Callable

from infra.cluster.control import QueuedJob
from infra.commands import head_node, ledger_spend, nodes, workspace
from infra.commands.checkpoints import job_status, last_checkpoint
from infra.errors import ConfigError
from infra.jobs.spool import current_run_uri
from infra.report import format_table
from training.contract import (
    GOODPUT_FIELD,
    RUN_SPANS_FIELD,
    RUN_USD_FIELD,
    price_field,
    price_words,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    workspace.add_stack_argument(parser)
    parser.add_argument(
        "--watch",
        type=float,
        metavar="SECONDS",
        help="print it again every SECONDS until Ctrl-C (waiting for capacity, an image push)",
    )


def run(
    args: argparse.Namespace,
    *,
    now: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(datetime.UTC),
    out=None,
    sleep: Callable[[float], None] = time.sleep,
) -> str:
    """Per node (or Slurm queue): state; each job's step, loss, rate, time left; spend."""
    watch = args.watch
    if watch is not None and watch <= 0:
        raise ConfigError(f"--watch {watch:g}: give seconds above 0")
    stack = workspace.deployed(workspace.stack_name(args))
    if watch is None:
        return report(stack, now())
    out = out or sys.stdout
    try:
        while True:
            out.write(f"{report(stack, now())}\n\n")
            out.flush()
            sleep(watch)
    except KeyboardInterrupt:
        return ""


def report(stack: workspace.Deployed, now: datetime.datetime) -> str:
    """The status text of a stack that is up, as of `now`."""
    if stack.is_cluster:
        return cluster_report(stack, now)
    out = stack.outputs
    ec2, s3 = workspace.aws("ec2", stack.region), workspace.aws("s3", stack.region)
    lines = [
        f"stack       {stack.name} ({stack.region}): {out.nodes} x "
        f"{out.instance_type}, {out.market}, ${out.hourly_cost_usd:,.2f}/h while running",
        "",
        format_table(
            ("NODE", "INSTANCE", "STATE", "SPOT REQUEST"),
            [
                (n.rank, n.instance_id, n.state, n.spot_request or "-")
                for n in nodes.nodes(ec2, stack.instance_ids)
            ],
        ),
        "",
    ]
    run_uri = current_run_uri(s3, stack.checkpoint_uri)  # the spool's current job
    progress = job_status(s3, run_uri)
    lines.append(f"job         {describe_job(progress, now)}")
    rate = unit_cost(out.hourly_cost_usd, progress)
    if rate:
        lines.append(f"cost        {rate}")
    if progress is not None and RUN_SPANS_FIELD in progress and stack.outputs.spend_ledger_table:
        lines.append(f"run spend   {_run_spend(stack, progress[RUN_SPANS_FIELD])}")
    checkpoint = last_checkpoint(s3, run_uri)
    lines.append(f"checkpoint  {checkpoint.describe() if checkpoint else 'none yet'}")
    lines.append(f"spend       {_spend(stack, now)}")
    return "\n".join(lines)


def cluster_report(stack: workspace.Deployed, now: datetime.datetime) -> str:
    """A cluster stack: its instances, its queue and each queued job's progress."""
    out = stack.outputs
    found = head_node.cluster_nodes(workspace.aws("ec2", stack.region), stack.cost_tag, out.market)
    lines = [
        f"stack       {stack.name} ({stack.region}): Slurm cluster, queue {out.queue} of "
        f"up to {out.nodes} x {out.instance_type}, {out.market}, "
        f"${out.hourly_cost_usd:,.2f}/h with every node running; "
        f"${out.idle_usd_per_hour or 0:,.2f}/h idle (the head node and the NAT gateway)",
        "",
        format_table(
            ("ROLE", "INSTANCE", "TYPE", "STATE", "MARKET"),
            [(n.role, n.instance_id, n.instance_type, n.state, n.market) for n in found],
        ),
        "",
    ]
    state = head_node.head_node_state(stack, found)
    if state != "running":
        lines.append(
            f"queue       unknown: the head node is {state}; "
            f"`python -m infra start {stack.name}` starts it"
        )
    else:
        try:
            jobs = head_node.queue(stack)
        except ConfigError as unanswered:  # the rest of the status still stands
            jobs = []
            lines.append(f"queue       unknown: {unanswered}")
        else:
            lines.append(f"queue       {_queue_summary(jobs)}")
        if jobs:
            lines += [
                "",
                format_table(
                    ("JOB", "NAME", "STATE", "NODES", "TIME", "REASON"),
                    [(j.id, j.name, _job_state(j), j.nodes, j.elapsed, j.reason) for j in jobs],
                ),
                "",
            ]
        s3 = workspace.aws("s3", stack.region)
        for job in jobs:
            uri = head_node.run_uri(stack, job)
            checkpoint = last_checkpoint(s3, uri)
            lines.append(f"job {job.name:<8}{describe_job(job_status(s3, uri), now)}")
            lines.append(f"  checkpoint  {checkpoint.describe() if checkpoint else 'none yet'}")
    lines.append(f"spend       {_spend(stack, now)}")
    return "\n".join(lines)


def _queue_summary(jobs: list[QueuedJob]) -> str:
    if not jobs:
        return "empty: no job, so no compute node runs (`pulumi stack output submit_command`)"
    held = sum(job.held for job in jobs)
    text = f"{len(jobs)} job(s)"
    if held:
        text += f", {held} held (`python -m infra start` releases them)"
    return text


def _job_state(job: QueuedJob) -> str:
    if job.held:
        return "held"
    if job.state == "PENDING":
        return "waiting for nodes"
    return job.state.lower()


def describe_job(status: dict | None, now: datetime.datetime) -> str:
    if status is None:
        return "no progress published yet (the image may still be pulling: see logs)"
    step, total = status["step"], status["total_steps"]
    parts = [
        f"{status['state']} at step {step:,} of {total:,} ({100 * step / total:.0f}%)",
        f"loss {status['loss']:.4f}",
        f"{status['tokens_per_s']:,.0f} {status.get('unit', 'tokens')}/s",
    ]
    if GOODPUT_FIELD in status:  # the whole run's (every start); older trainers lack it
        parts.append(f"goodput {100 * status[GOODPUT_FIELD]:.0f}%")
        price = status.get(price_field(status.get("unit", "tokens")))
        if price is not None:
            parts.append(price_words(price, status.get("unit", "tokens")))
        if RUN_USD_FIELD in status:
            parts.append(f"${status[RUN_USD_FIELD]:,.2f} for the run so far")
    if status["state"] == "training":
        parts.append(f"{_duration(status['seconds_left'])} to finish")
    if status.get("straggler_rank") is not None:  # written by training/stragglers.py
        parts.append(f"rank {status['straggler_rank']} is a straggler (see the job's log)")
    updated = datetime.datetime.fromisoformat(status["updated_at"])
    parts.append(f"as of {_duration((now - updated).total_seconds())} ago")
    return ", ".join(parts)


def unit_cost(hourly_usd: float | None, status: dict | None) -> str:
    """What a billion tokens (or a million images) cost at the job's current rate, with every
    node of the stack running: the figure to compare runs and instance types by."""
    if not hourly_usd or status is None or not status.get("tokens_per_s"):
        return ""
    unit = status.get("unit", "tokens")
    per = 1e9 if unit == "tokens" else 1e6
    usd = hourly_usd / (status["tokens_per_s"] * 3600) * per
    amount = "billion" if per == 1e9 else "million"
    return (
        f"${usd:,.2f} per {amount} {unit} at ${hourly_usd:,.2f}/h and "
        f"{status['tokens_per_s']:,.0f} {unit}/s"
    )


def _duration(seconds: float) -> str:
    minutes = round(max(seconds, 0) / 60)
    if minutes < 60:
        return f"{minutes} min"
    return f"{minutes // 60} h {minutes % 60:02d} min"


def _run_spend(stack: workspace.Deployed, published_spans) -> str:
    """What the stack spent while the job ran (each of its starts), from the spend guard's
    ledger: on a single-node stack, the job's cost with its volumes and address."""
    spans = ledger_spend.spans_from(published_spans)
    spent = ledger_spend.spend_reader(stack)(spans)
    return (
        f"${spent:,.2f} over its {len(spans)} start(s) since "
        f"{spans[0][0]:%Y-%m-%d %H:%M} UTC, from the spend guard's ledger"
    )


def _spend(stack: workspace.Deployed, now: datetime.datetime) -> str:
    budget = f"budget ${stack.outputs.monthly_budget_usd:,.2f} a month"
    table = stack.outputs.spend_ledger_table
    if not table:
        return f"{budget}; no spend ledger (the stack predates the spend guard: `up` adds it)"
    # The spend guard's own code (it imports boto3: not at start-up, see infra/commands).
    from infra.functions.ledger import read_ledger
    from infra.functions.spend_guard import budget_period

    period, _ = budget_period(now, stack.budget_period)
    ledger = read_ledger(workspace.aws("dynamodb", stack.region), table, period)
    if ledger is None:
        return f"{budget}; the spend guard has not counted {period} yet"
    left = ledger.budget_usd - ledger.spent_usd
    text = (
        f"${ledger.spent_usd:,.2f} of ${ledger.budget_usd:,.2f} in {ledger.period}, "
        f"${left:,.2f} left"
    )
    if ledger.stopped:
        text += f"; the spend guard stopped the stack ({ledger.stop_reason or 'budget spent'})"
    return text
