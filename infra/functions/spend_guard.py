"""The spend guard: a Lambda function, run on a schedule, that holds a stack to its budget.

It needs no billing data (AWS Budgets sees spend 8-24 hours late). Each run it asks EC2 for the
stack's instances, found by the stack's cost tag, so it also covers instances the stack did not
create itself (Slurm's dynamic nodes carry the tag), prices their running time since the last
run and adds it to the period's ledger (infra/functions/ledger.py). Past each alert threshold it
publishes one notice to the alert topic; at the budget it stops every running instance of the
stack, and stops any that start again until the budget is raised or the period ends. An
instance it cannot price stops the stack too: it never counts an unknown price as zero.

EC2 facts it relies on (EC2 API Reference, Instance data type,
docs.aws.amazon.com/AWSEC2/latest/APIReference/API_Instance.html):
- `LaunchTime` is the time the instance last started (a start after a stop moves it);
- `StateTransitionReason` carries the time of a user's stop or termination, e.g.
  "User initiated (2026-12-01 10:00:00 GMT)"; a service stop may carry none;
- `InstanceLifecycle` is "spot" or "capacity-block" for those markets, absent for on-demand
  (an On-Demand Capacity Reservation is billed at the on-demand rate).
Billing runs only in the `running` state: pending and stopped instances are not billed
("Instance state and billing", docs.aws.amazon.com/AWSEC2/latest/UserGuide/
ec2-instance-lifecycle.html). Terminated instances stay visible for about an hour, so a run every
few minutes sees each end.

The clock is a parameter of `run_guard`; `handler` is the Lambda entry point.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import boto3
from botocore.exceptions import ClientError

from infra.functions.ledger import Ledger, read_ledger, write_ledger
from infra.functions.settings import GuardSettings

UTC = datetime.UTC
BILLED_STATE = "running"
STOPPABLE_STATES = ("pending", "running")
ENDED_STATES = ("stopping", "stopped", "shutting-down", "terminated")
WRITE_ATTEMPTS = 3  # a lost conditional write re-reads the ledger and accounts again
_STATE_TIME = re.compile(r"\((\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}) (?:GMT|UTC)\)")
_CONFLICT = "ConditionalCheckFailedException"


@dataclass(frozen=True)
class Charge:
    """Running time of one instance within one run's window, and its price (None: unknown)."""

    instance_id: str
    instance_type: str
    market: str
    hours: float
    usd_per_hour: float | None

    @property
    def usd(self) -> float:
        return self.hours * (self.usd_per_hour or 0.0)


@dataclass(frozen=True)
class Outcome:
    ledger: Ledger
    charges: tuple[Charge, ...]
    stopped_instances: tuple[str, ...]  # stopped by this run
    notices: tuple[str, ...]  # subjects published by this run
    unstoppable: tuple[str, ...] = ()  # "id (EC2 error code)" for each stop EC2 refused


def budget_period(now: datetime.datetime, period: str) -> tuple[str, datetime.datetime]:
    """The period's ledger key and its first instant (AWS Budgets periods are UTC)."""
    if period == "DAILY":
        start = now.replace(hour=0, minute=0, second=0, microsecond=0)
        return start.strftime("%Y-%m-%d"), start
    start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    return start.strftime("%Y-%m"), start


def stack_instances(ec2: Any, cost_tag: tuple[str, str]) -> list[dict[str, Any]]:
    """Every instance carrying the stack's cost tag, in any state."""
    key, value = cost_tag
    pages = ec2.get_paginator("describe_instances").paginate(
        Filters=[{"Name": f"tag:{key}", "Values": [value]}]
    )
    return [
        instance
        for page in pages
        for reservation in page["Reservations"]
        for instance in reservation["Instances"]
    ]


def market(instance: dict[str, Any]) -> str:
    return instance.get("InstanceLifecycle") or "on-demand"


def running_hours(
    instance: dict[str, Any],
    since: datetime.datetime,
    now: datetime.datetime,
    *,
    was_running: bool,
) -> float:
    """Hours the instance ran within [since, now], from what EC2 says of it now.

    An end EC2 does not date, of an instance that ran in the window, counts as `now`; an
    instance that was running at `since` and has restarted since counts as running until its
    restart. Both may count a few minutes too many, never too few.
    """
    state = instance["State"]["Name"]
    started = _aware(instance["LaunchTime"])
    if state == BILLED_STATE:
        ended = now
    elif state in ENDED_STATES:
        dated = _state_time(instance.get("StateTransitionReason", ""))
        ran_in_window = was_running or started > since
        ended = dated or (now if ran_in_window else started)
    else:  # pending: not billed yet
        ended = started
    seconds = _overlap(started, ended, since, now)
    if was_running and started > since:
        seconds += _overlap(since, started, since, now)
    return seconds / 3600


def run_guard(
    settings: GuardSettings, *, ec2: Any, dynamodb: Any, sns: Any, now: datetime.datetime
) -> Outcome:
    """Account the stack's spend up to `now`, then alert and stop as the ledger says."""
    period, period_start = budget_period(now, settings.budget_period)
    for attempt in range(WRITE_ATTEMPTS):
        before = read_ledger(dynamodb, settings.table, period) or _opening(period, period_start)
        instances = stack_instances(ec2, settings.cost_tag)
        since = max(before.accounted_until_time, period_start)
        charges = _charges(settings, ec2, instances, before, since, now) if now > since else ()
        ledger = _account(settings, before, instances, charges, now)
        try:
            write_ledger(dynamodb, settings.table, ledger, after=before.version)
            break
        except ClientError as exc:
            if exc.response["Error"]["Code"] != _CONFLICT or attempt == WRITE_ATTEMPTS - 1:
                raise
    stopped, unstoppable = _stop(ec2, instances) if ledger.stopped else ((), ())
    notices = _notices(settings, ledger, stopped, unstoppable)
    for subject, message in notices:
        sns.publish(TopicArn=settings.topic_arn, Subject=subject, Message=message)
    crossed = _crossed(settings, ledger)
    if crossed:
        notified = dataclasses.replace(
            ledger,
            notified_thresholds=(*ledger.notified_thresholds, *crossed),
            version=ledger.version + 1,
        )
        try:
            write_ledger(dynamodb, settings.table, notified, after=ledger.version)
            ledger = notified
        except ClientError as exc:  # a newer run holds the ledger; it notifies again
            if exc.response["Error"]["Code"] != _CONFLICT:
                raise
    subjects = tuple(subject for subject, _ in notices)
    return Outcome(ledger, tuple(charges), stopped, subjects, unstoppable)


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """Lambda entry point (EventBridge Scheduler invokes it every few minutes)."""
    settings = GuardSettings.from_environment(os.environ)
    outcome = run_guard(
        settings,
        ec2=boto3.client("ec2"),
        dynamodb=boto3.client("dynamodb"),
        sns=boto3.client("sns"),
        now=datetime.datetime.now(UTC),
    )
    ledger = outcome.ledger
    summary = {
        "period": ledger.period,
        "spent_usd": round(ledger.spent_usd, 2),
        "budget_usd": ledger.budget_usd,
        "stopped": ledger.stopped,
        "stop_reason": ledger.stop_reason,
        "stopped_instances": list(outcome.stopped_instances),
        "notices": list(outcome.notices),
    }
    print(json.dumps(summary))  # one line per run in the function's log group
    return summary


def _opening(period: str, start: datetime.datetime) -> Ledger:
    return Ledger(
        period=period,
        spent_usd=0.0,
        budget_usd=0.0,
        stopped=False,
        notified_thresholds=(),
        updated_at=start.isoformat(),
        accounted_until=start.isoformat(),
    )


def _charges(
    settings: GuardSettings,
    ec2: Any,
    instances: Iterable[dict[str, Any]],
    before: Ledger,
    since: datetime.datetime,
    now: datetime.datetime,
) -> tuple[Charge, ...]:
    spot_prices: dict[tuple[str, str], float | None] = {}
    charges = []
    for instance in instances:
        hours = running_hours(
            instance, since, now, was_running=instance["InstanceId"] in before.running
        )
        if hours <= 0:
            continue
        kind = market(instance)
        if kind == "spot":
            zone = instance["Placement"]["AvailabilityZone"]
            key = (instance["InstanceType"], zone)
            if key not in spot_prices:
                spot_prices[key] = _spot_price(ec2, settings, *key, since, now)
            price = spot_prices[key]
        else:
            price = settings.price(instance["InstanceType"], kind)
        charges.append(Charge(instance["InstanceId"], instance["InstanceType"], kind, hours, price))
    return tuple(charges)


def _spot_price(
    ec2: Any,
    settings: GuardSettings,
    instance_type: str,
    zone: str,
    since: datetime.datetime,
    now: datetime.datetime,
) -> float | None:
    """The dearer of EC2's spot price history over the window and the plan's spot price."""
    history = ec2.describe_spot_price_history(
        InstanceTypes=[instance_type],
        AvailabilityZone=zone,
        ProductDescriptions=["Linux/UNIX"],
        StartTime=since,
        EndTime=now,
    )["SpotPriceHistory"]
    observed = [float(entry["SpotPrice"]) for entry in history]
    planned = settings.price(instance_type, "spot")
    known = [*observed, *([planned] if planned is not None else [])]
    return max(known) if known else None


def _account(
    settings: GuardSettings,
    before: Ledger,
    instances: Iterable[dict[str, Any]],
    charges: Iterable[Charge],
    now: datetime.datetime,
) -> Ledger:
    charges = tuple(charges)
    instances = tuple(instances)
    accounted_until = max(before.accounted_until_time, now)
    spent = before.spent_usd + sum(charge.usd for charge in charges)
    reasons = []
    if spent >= settings.budget_usd:
        reasons.append(
            f"the stack spent ${spent:,.2f} of its ${settings.budget_usd:,.2f} "
            f"{settings.budget_period.lower()} budget (period {before.period})"
        )
    unpriced = [charge for charge in charges if charge.usd_per_hour is None]
    if unpriced:
        named = ", ".join(
            sorted({f"{c.instance_type} ({c.market}, {c.instance_id})" for c in unpriced})
        )
        reasons.append(
            f"the guard has no price in {settings.region} for {named}, so it cannot count "
            "what they cost and stops the stack rather than count them as free; add the "
            "price to infra/knowledge/data/prices.toml and run pulumi up"
        )
    running = tuple(
        sorted(i["InstanceId"] for i in instances if i["State"]["Name"] == BILLED_STATE)
    )
    notified = before.notified_thresholds
    if before.budget_usd != settings.budget_usd:  # a new budget: thresholds of the new one
        notified = tuple(t for t in notified if spent >= settings.budget_usd * t / 100)
    return dataclasses.replace(
        before,
        spent_usd=spent,
        notified_thresholds=notified,
        budget_usd=settings.budget_usd,
        stopped=bool(reasons),
        stop_reason="; ".join(reasons),
        updated_at=now.isoformat(),
        accounted_until=accounted_until.isoformat(),
        running=running if now >= before.accounted_until_time else before.running,
        version=before.version + 1,
    )


def _stop(ec2: Any, instances: Iterable[dict[str, Any]]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Stop every running or starting instance; their disks stay (a stop, not a terminate).

    EC2 refuses the whole call when it cannot stop one of them (a one-time spot instance,
    say): then each is stopped on its own, so the others stop still. Returns (stopped,
    "id (error code)" of each refused).
    """
    ids = sorted(i["InstanceId"] for i in instances if i["State"]["Name"] in STOPPABLE_STATES)
    if not ids:
        return (), ()
    try:
        ec2.stop_instances(InstanceIds=ids)
        return tuple(ids), ()
    except ClientError:
        stopped, refused = [], []
        for instance_id in ids:
            try:
                ec2.stop_instances(InstanceIds=[instance_id])
                stopped.append(instance_id)
            except ClientError as exc:
                refused.append(f"{instance_id} ({exc.response['Error']['Code']})")
        return tuple(stopped), tuple(refused)


def _crossed(settings: GuardSettings, ledger: Ledger) -> tuple[float, ...]:
    return tuple(
        threshold
        for threshold in sorted(settings.thresholds_percent)
        if threshold not in ledger.notified_thresholds
        and ledger.spent_usd >= settings.budget_usd * threshold / 100
    )


def _notices(
    settings: GuardSettings,
    ledger: Ledger,
    stopped: tuple[str, ...],
    unstoppable: tuple[str, ...],
) -> list[tuple[str, str]]:
    """(subject, message) for each threshold newly passed and for a stop this run made."""
    stack = settings.cost_tag[1]
    spent = f"${ledger.spent_usd:,.2f} of ${settings.budget_usd:,.2f}"
    notices = [
        (
            f"{stack}: spend passed {threshold:g}% of its budget",
            f"The spend guard counts {spent} spent in period {ledger.period} "
            f"(EC2 running time at {settings.region} prices, up to {ledger.accounted_until}).",
        )
        for threshold in _crossed(settings, ledger)
    ]
    if stopped:
        notices.append(
            (
                f"{stack}: spend guard stopped {len(stopped)} instance(s)",
                f"Stopped {', '.join(stopped)} because {ledger.stop_reason}. Their volumes are "
                "kept. The guard stops them again until the budget (gpu:budgetUsd) is raised "
                "or the period ends.",
            )
        )
    if unstoppable:
        notices.append(
            (
                f"{stack}: spend guard could not stop {len(unstoppable)} instance(s)",
                f"EC2 refused to stop {', '.join(unstoppable)}, which should stop because "
                f"{ledger.stop_reason}. Stop or terminate them yourself.",
            )
        )
    return [(subject[:100], message) for subject, message in notices]  # SNS: subject <= 100


def _aware(moment: datetime.datetime) -> datetime.datetime:
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _state_time(reason: str) -> datetime.datetime | None:
    match = _STATE_TIME.search(reason)
    if match is None:
        return None
    return datetime.datetime.strptime(match[1], "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC)


def _overlap(
    start: datetime.datetime,
    end: datetime.datetime,
    window_start: datetime.datetime,
    window_end: datetime.datetime,
) -> float:
    return max(0.0, (min(end, window_end) - max(start, window_start)).total_seconds())
