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
few minutes sees each end. Beside running time it counts what bills without it: the stack's
EBS volumes, running or stopped (infra/functions/volumes.py), and each instance's public IPv4
address while it runs (`PublicIpAddress`; EC2 releases an auto-assigned one when the instance
stops: "Public IPv4 addresses", docs.aws.amazon.com/AWSEC2/latest/UserGuide/
using-instance-addressing.html). Stopping a stack ends neither the volumes' bill nor what
the ledger counts of them: past the budget, the stopped stack's volumes go on costing their
monthly rate. A Slurm cluster's NAT gateway and its public address bill by the hour for as
long as they exist, whether any node runs or not ("Amazon VPC pricing", NAT gateway:
aws.amazon.com/vpc/pricing/): the ledger counts them from their CreateTime to their
DeleteTime (DescribeNatGateways: docs.aws.amazon.com/AWSEC2/latest/APIReference/
API_NatGateway.html), past a stop too, until `down` deletes them.

The clock is a parameter of `run_guard`; `handler` is the Lambda entry point.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import math
import os
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import boto3
from botocore.exceptions import BotoCoreError, ClientError

from common.market import Market
from infra.functions import fleet, volumes
from infra.functions.ledger import Ledger, from_item, read_item, write_ledger
from infra.functions.settings import GuardSettings
from infra.functions.slurm_queue import HOLD_BOUND_S, JOB_END_WAIT_S, hold_script

UTC = datetime.UTC
BILLED_STATE = "running"
STOPPABLE_STATES = ("pending", "running")
ENDED_STATES = ("stopping", "stopped", "shutting-down", "terminated")
WRITE_ATTEMPTS = 3  # a lost conditional write re-reads the ledger and accounts again
_STATE_TIME = re.compile(r"\((\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}) (?:GMT|UTC)\)")
_CONFLICT = fleet.CONDITION_FAILED
# A ledger dated later than this past the run's clock is not a concurrent run's: it is wrong.
FUTURE_TOLERANCE = datetime.timedelta(minutes=5)
# ParallelCluster tags each node with its role (aws-parallelcluster v3.15.1,
# cli/src/pcluster/constants.py: PCLUSTER_NODE_TYPE_TAG = "parallelcluster:node-type";
# values "HeadNode" and "Compute").
NODE_TYPE_TAG = "parallelcluster:node-type"
COMPUTE_NODE = "Compute"
HEAD_NODE = "HeadNode"


PUBLIC_IPV4 = "public IPv4"
EBS_VOLUME = "EBS volume"
NAT_GATEWAY = "NAT gateway"
# NAT gateways in these states bill no hour (DescribeNatGateways, State; "Amazon VPC
# pricing": a gateway bills while it is provisioned).
UNBILLED_NAT_STATES = ("failed",)
HOLD_POLL_S = 3
# Run Command's ended states (GetCommandInvocation, Status).
SSM_ENDED = ("Success", "Failed", "Cancelled", "TimedOut", "Undeliverable", "Terminated")


@dataclass(frozen=True)
class Charge:
    """Billed time of one resource within one run's window, and its price (None: unknown):
    an instance (`item` its type, `market` how it is bought), its public IPv4 address or an
    EBS volume (`market` PUBLIC_IPV4 or EBS_VOLUME)."""

    resource_id: str
    item: str
    market: str
    hours: float
    usd_per_hour: float | None

    @property
    def usd(self) -> float:
        return self.hours * (self.usd_per_hour or 0.0)


@dataclass(frozen=True)
class Enforcement:
    """What one run did to hold the stack to its budget."""

    stopped: tuple[str, ...] = ()
    terminated: tuple[str, ...] = ()  # compute nodes, and spot instances EC2 will not stop
    refused: tuple[str, ...] = ()  # "id (EC2 error code)" for each instance EC2 kept running
    fleet_stop_requested: bool = False
    held_jobs: int | None = None  # a cluster's jobs held (checkpointed) before the stop
    problems: tuple[str, ...] = ()


@dataclass(frozen=True)
class Outcome:
    ledger: Ledger
    charges: tuple[Charge, ...]
    stopped_instances: tuple[str, ...]  # stopped by this run
    notices: tuple[str, ...]  # subjects published by this run
    unstoppable: tuple[str, ...] = ()  # "id (EC2 error code)" for each stop EC2 refused
    terminated_instances: tuple[str, ...] = ()
    problems: tuple[str, ...] = ()  # what went wrong this run, in the function's log


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


def _node_type(instance: dict[str, Any]) -> str:
    return next((t["Value"] for t in instance.get("Tags", []) if t["Key"] == NODE_TYPE_TAG), "")


def market(instance: dict[str, Any]) -> Market:
    """Spot, capacity block or on-demand (a reservation's instances are on-demand ones); a
    lifecycle EC2 may add later counts at the on-demand price, the dearest."""
    lifecycle = instance.get("InstanceLifecycle")
    return Market(lifecycle) if lifecycle in Market.__members__.values() else Market.ON_DEMAND


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
    settings: GuardSettings,
    *,
    ec2: Any,
    dynamodb: Any,
    sns: Any,
    now: datetime.datetime,
    ssm: Any = None,
    sleep: Callable[[float], None] = time.sleep,
) -> Outcome:
    """Account the stack's spend up to `now`, then stop and alert as the ledger says.

    It never fails open: a ledger item it cannot read is rebuilt from EC2's facts (and
    reported), and a ledger it cannot write does not keep it from stopping the stack. `ssm`
    reaches a cluster's head node (its jobs are held before the stop); `sleep` paces that.
    """
    period, period_start = budget_period(now, settings.budget_period)
    closing = _close_previous_period(settings, ec2, dynamodb, period_start)
    write_error = ""
    for attempt in range(WRITE_ATTEMPTS):
        try:
            before, unreadable = _read_before(dynamodb, settings.table, period, period_start, now)
            read_error = ""
        except (ClientError, BotoCoreError) as exc:
            # The table does not answer: count from EC2's facts alone, and write nothing
            # over a ledger this run could not see.
            before, unreadable = _opening(period, period_start), "its table did not answer"
            read_error = f"the ledger could not be read ({_error_code(exc)}): spend counted "
            read_error += "from EC2's running times since the period began"
        if before.version == 0 and closing is not None:  # running across the boundary
            before = dataclasses.replace(before, running=closing.running)
        instances = stack_instances(ec2, settings.cost_tag)
        disks, disks_problem = _stack_volumes(settings, ec2, instances, before, period_start)
        block_fee, block_problem = _capacity_block_fee(settings, ec2, before)
        since = max(before.accounted_until_time, period_start)
        gateways, gateways_problem = _nat_gateway_charges(settings, ec2, since, now)
        charges = (
            (*_charges(settings, ec2, instances, disks, before, since, now), *gateways)
            if now > since
            else ()
        )
        ledger = _account(
            settings,
            before,
            instances,
            disks,
            charges,
            now,
            block_fee=block_fee,
            rebuilt=bool(unreadable),
        )
        if read_error:
            write_error = read_error
            break
        try:
            write_ledger(
                dynamodb, settings.table, ledger, after=None if unreadable else before.version
            )
            break
        except (ClientError, BotoCoreError) as exc:
            code = _error_code(exc)
            if code == _CONFLICT and attempt < WRITE_ATTEMPTS - 1:
                continue
            write_error = f"the ledger could not be written ({code}): this run's count is lost"
            break
    problems = [_unreadable_notice(period, unreadable)] if unreadable and not read_error else []
    problems += [p for p in (disks_problem, block_problem, gateways_problem) if p]
    enforcement = (
        _enforce(settings, ec2, dynamodb, instances, now, ssm=ssm, sleep=sleep)
        if ledger.stopped
        else None
    )
    if enforcement is not None:
        problems.extend(enforcement.problems)
    notices = [*ledger.unsent, *_notices(settings, ledger, enforcement, problems)]
    unsent = tuple(notice for notice in notices if not _publish(sns, settings.topic_arn, notice))
    crossed = _crossed(settings, ledger)
    if not write_error and (crossed or unsent != ledger.unsent):
        noted = dataclasses.replace(
            ledger,
            notified_thresholds=(*ledger.notified_thresholds, *crossed),
            unsent=unsent,
            version=ledger.version + 1,
        )
        try:
            write_ledger(dynamodb, settings.table, noted, after=ledger.version)
            ledger = noted
        except (ClientError, BotoCoreError):  # a newer run holds the ledger: it notifies again
            pass
    sent = tuple(subject for subject, message in notices if (subject, message) not in unsent)
    done = enforcement or Enforcement()
    return Outcome(
        ledger,
        tuple(charges),
        done.stopped,
        sent,
        done.refused,
        done.terminated,
        tuple(problems) + ((write_error,) if write_error else ()),
    )


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """Lambda entry point (EventBridge Scheduler invokes it every few minutes)."""
    settings = GuardSettings.from_environment(os.environ)
    outcome = run_guard(
        settings,
        ec2=boto3.client("ec2"),
        dynamodb=boto3.client("dynamodb"),
        sns=boto3.client("sns"),
        now=datetime.datetime.now(UTC),
        ssm=boto3.client("ssm") if settings.cluster_name else None,
    )
    ledger = outcome.ledger
    summary = {
        "period": ledger.period,
        "spent_usd": round(ledger.spent_usd, 2),
        "budget_usd": ledger.budget_usd,
        "stopped": ledger.stopped,
        "stop_reason": ledger.stop_reason,
        "stopped_instances": list(outcome.stopped_instances),
        "terminated_instances": list(outcome.terminated_instances),
        "notices": list(outcome.notices),
        "problems": list(outcome.problems),
    }
    print(json.dumps(summary))  # one line per run in the function's log group
    return summary


def _close_previous_period(
    settings: GuardSettings, ec2: Any, dynamodb: Any, period_start: datetime.datetime
) -> Ledger | None:
    """Count the end of the period before this one, from its last run to its last instant:
    the first run of a period is the only one that can. Returns that period's ledger."""
    previous, previous_start = budget_period(
        period_start - datetime.timedelta(microseconds=1), settings.budget_period
    )
    try:
        item = read_item(dynamodb, settings.table, previous)
        before = from_item(item) if item else None
    except (
        KeyError,
        ValueError,
        TypeError,
        IndexError,
        AttributeError,
        ClientError,
        BotoCoreError,
    ):
        return None  # its own runs reported it; this period's count goes on
    if before is None or before.accounted_until_time >= period_start:
        return before
    instances = stack_instances(ec2, settings.cost_tag)
    disks, _ = _stack_volumes(settings, ec2, instances, before, previous_start)
    since = max(before.accounted_until_time, previous_start)
    charges = _charges(settings, ec2, instances, disks, before, since, period_start)
    closed = _account(settings, before, instances, disks, charges, period_start)
    with contextlib.suppress(ClientError, BotoCoreError):  # another run closed it first
        write_ledger(dynamodb, settings.table, closed, after=before.version)
    return closed


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


def _stack_volumes(
    settings: GuardSettings,
    ec2: Any,
    instances: Iterable[dict[str, Any]],
    before: Ledger,
    period_start: datetime.datetime,
) -> tuple[list[volumes.Volume], str]:
    """The stack's volumes and "", or, when EC2 does not list them, those the ledger knew
    (counted as present since the period began) and the problem."""
    try:
        return volumes.stack_volumes(
            ec2, settings.cost_tag, instances, settings.ebs_usd_per_gb_month
        ), ""
    except (ClientError, BotoCoreError) as exc:
        known = [volumes.Volume(v, period_start, monthly) for v, monthly in before.volumes]
        return known, (
            f"EC2 did not list the stack's volumes ({_error_code(exc)}): the ones the ledger "
            "knew are counted, any new one is not"
        )


def _charges(
    settings: GuardSettings,
    ec2: Any,
    instances: Iterable[dict[str, Any]],
    disks: Iterable[volumes.Volume],
    before: Ledger,
    since: datetime.datetime,
    now: datetime.datetime,
) -> tuple[Charge, ...]:
    spot_prices: dict[tuple[str, str], float | None] = {}
    charges = _volume_charges(disks, before, since, now)
    for instance in instances:
        instance_id = instance["InstanceId"]
        hours = running_hours(instance, since, now, was_running=instance_id in before.running)
        if hours <= 0:
            continue
        if instance.get("PublicIpAddress") or instance_id in before.addressed:
            charges.append(
                Charge(
                    instance_id, PUBLIC_IPV4, PUBLIC_IPV4, hours, settings.public_ipv4_usd_per_hour
                )
            )
        kind = market(instance)
        if kind == Market.SPOT:
            zone = instance["Placement"]["AvailabilityZone"]
            key = (instance["InstanceType"], zone)
            if key not in spot_prices:
                spot_prices[key] = _spot_price(ec2, settings, *key, since, now)
            price = spot_prices[key]
        elif kind == Market.CAPACITY_BLOCK and settings.capacity_block_id in before.prepaid_blocks:
            price = 0.0  # its whole fee is counted already
        else:
            price = settings.price(instance["InstanceType"], kind)
        charges.append(Charge(instance_id, instance["InstanceType"], kind, hours, price))
    return tuple(charges)


def _volume_charges(
    disks: Iterable[volumes.Volume],
    before: Ledger,
    since: datetime.datetime,
    now: datetime.datetime,
) -> list[Charge]:
    """Each volume from its creation (or `since`) to `now`; one the ledger knew that is gone
    was deleted at a time EC2 no longer says: counted through the window."""
    month_hours = volumes.hours_in_month(since)
    present = {disk.volume_id for disk in disks}
    spans = [(d.volume_id, d.usd_per_month, d.created) for d in disks]
    spans += [(v, monthly, since) for v, monthly in before.volumes if v not in present]
    return [
        Charge(
            volume_id,
            EBS_VOLUME,
            EBS_VOLUME,
            _overlap(created, now, since, now) / 3600,
            monthly / month_hours,
        )
        for volume_id, monthly, created in spans
        if created < now
    ]


def _nat_gateway_charges(
    settings: GuardSettings, ec2: Any, since: datetime.datetime, now: datetime.datetime
) -> tuple[list[Charge], str]:
    """Each NAT gateway carrying the stack's tag, and its public address, for its hours within
    [since, now] (a deleted one is listed for about an hour, with its DeleteTime); and a
    problem when EC2 does not list them."""
    key, value = settings.cost_tag
    try:
        gateways = [
            gateway
            for page in ec2.get_paginator("describe_nat_gateways").paginate(
                Filters=[{"Name": f"tag:{key}", "Values": [value]}]
            )
            for gateway in page["NatGateways"]
        ]
    except (ClientError, BotoCoreError) as exc:
        return [], f"EC2 did not list the stack's NAT gateways ({_error_code(exc)}): not counted"
    charges = []
    nat_rate = settings.nat_gateway_usd_per_hour or None  # none given: unpriced, not free
    for gateway in gateways:
        if gateway.get("State") in UNBILLED_NAT_STATES:
            continue
        ended = _aware(gateway["DeleteTime"]) if gateway.get("DeleteTime") else now
        hours = _overlap(_aware(gateway["CreateTime"]), ended, since, now) / 3600
        if hours <= 0:
            continue
        gateway_id = gateway["NatGatewayId"]
        charges.append(Charge(gateway_id, NAT_GATEWAY, NAT_GATEWAY, hours, nat_rate))
        charges += [
            Charge(
                address.get("AllocationId") or address["PublicIp"],
                PUBLIC_IPV4,
                PUBLIC_IPV4,
                hours,
                settings.public_ipv4_usd_per_hour,
            )
            for address in gateway.get("NatGatewayAddresses", [])
            if address.get("PublicIp")
        ]
    return charges, ""


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
    planned = settings.price(instance_type, Market.SPOT)
    known = [*observed, *([planned] if planned is not None else [])]
    return max(known) if known else None


def _account(
    settings: GuardSettings,
    before: Ledger,
    instances: Iterable[dict[str, Any]],
    disks: Iterable[volumes.Volume],
    charges: Iterable[Charge],
    now: datetime.datetime,
    *,
    block_fee: tuple[str, float] | None = None,
    rebuilt: bool = False,
) -> Ledger:
    """The ledger after this run. `block_fee` (block id, $) is a Capacity Block counted now;
    a `rebuilt` ledger (from an item the guard could not read) counts the larger of what the
    item still said and the running time EC2 shows since the period began."""
    charges = tuple(charges)
    instances = tuple(instances)
    accounted_until = max(before.accounted_until_time, now)
    counted = sum(charge.usd for charge in charges)
    spent = max(before.spent_usd, counted) if rebuilt else before.spent_usd + counted
    prepaid = before.prepaid_blocks
    if block_fee is not None:
        spent += block_fee[1]
        prepaid = (*prepaid, block_fee[0])
    reasons = []
    if spent >= settings.budget_usd:
        reasons.append(
            f"the stack spent ${spent:,.2f} of its ${settings.budget_usd:,.2f} "
            f"{settings.budget_period.lower()} budget (period {before.period})"
        )
    unpriced = [charge for charge in charges if charge.usd_per_hour is None]
    if unpriced:
        named = ", ".join(sorted({f"{c.item} ({c.market}, {c.resource_id})" for c in unpriced}))
        reasons.append(
            f"the guard has no price in {settings.region} for {named}, so it cannot count "
            "what they cost and stops the stack rather than count them as free; add the "
            "price to infra/knowledge/data/prices.toml and run pulumi up"
        )
    # Pending ones too: one that starts and is stopped between two runs is counted from here.
    running = tuple(
        sorted(i["InstanceId"] for i in instances if i["State"]["Name"] in STOPPABLE_STATES)
    )
    addressed = tuple(
        sorted(
            i["InstanceId"]
            for i in instances
            if i["State"]["Name"] in STOPPABLE_STATES and i.get("PublicIpAddress")
        )
    )
    latest = now >= before.accounted_until_time
    notified = before.notified_thresholds
    if before.budget_usd != settings.budget_usd:  # a new budget: thresholds of the new one
        notified = tuple(t for t in notified if spent >= settings.budget_usd * t / 100)
    after = dataclasses.replace(
        before,
        spent_usd=spent,
        notified_thresholds=notified,
        budget_usd=settings.budget_usd,
        stopped=bool(reasons),
        stop_reason="; ".join(reasons),
        updated_at=now.isoformat(),
        accounted_until=accounted_until.isoformat(),
        running=running if latest else before.running,
        volumes=tuple((d.volume_id, d.usd_per_month) for d in disks) if latest else before.volumes,
        addressed=addressed if latest else before.addressed,
        prepaid_blocks=prepaid,
        version=before.version + 1,
    )
    return after.with_mark() if latest else after


def _enforce(
    settings: GuardSettings,
    ec2: Any,
    dynamodb: Any,
    instances: Iterable[dict[str, Any]],
    now: datetime.datetime,
    *,
    ssm: Any = None,
    sleep: Callable[[float], None] = time.sleep,
) -> Enforcement:
    """End the stack's running spend, a cluster the way ParallelCluster does, head node last.

    Capacity Block instances are left alone: the block is paid up front, so stopping them
    saves nothing and wastes it. On a cluster with compute nodes, the jobs are asked first to
    checkpoint and are held (`scontrol requeuehold` on the head node, as `stop` does), for at
    most HOLD_BOUND_S; then the compute fleet's status is set to STOP_REQUESTED, so that
    clustermgtd launches no node for the held jobs and, when the head node starts again, keeps
    the queue inactive until the fleet is started; the compute nodes are terminated at once
    (what clustermgtd does on that request: their spot instances are one-time and cannot be
    stopped), and only then is the head node stopped: with it running, $/h would go on past
    the budget for as long as nobody looks. Terminating the nodes first would end the jobs
    without their checkpoint, and Slurm would requeue them (NODE_FAIL) unheld.
    """
    instances = list(instances)
    live = [
        i
        for i in instances
        if i["State"]["Name"] in STOPPABLE_STATES and market(i) != Market.CAPACITY_BLOCK
    ]
    compute = sorted(i["InstanceId"] for i in live if _node_type(i) == COMPUTE_NODE)
    rest = [i for i in live if _node_type(i) != COMPUTE_NODE]
    problems = []
    held_jobs = None
    if settings.cluster_name and compute:
        held_jobs, problem = _hold_jobs(settings, ssm, instances, sleep)
        problems += [problem] if problem else []
    fleet_stop_requested = False
    if settings.cluster_name and live:  # nothing runs: nothing to ask of clustermgtd
        fleet_stop_requested, problem = _request_fleet_stop(dynamodb, settings.cluster_name, now)
        problems += [problem] if problem else []
    terminated, refused = _terminate(ec2, compute)
    stopped: list[str] = []
    # The head node last, once no compute node needs its clustermgtd.
    for instance in sorted(rest, key=lambda i: (_node_type(i) == HEAD_NODE, i["InstanceId"])):
        instance_id = instance["InstanceId"]
        try:
            ec2.stop_instances(InstanceIds=[instance_id])
            stopped.append(instance_id)
        except ClientError as exc:
            if market(instance) != Market.SPOT:
                refused.append(f"{instance_id} ({exc.response['Error']['Code']})")
                continue
            # A one-time spot instance cannot be stopped: ending it is the only way to end
            # its bill ("Stop a Spot Instance", docs.aws.amazon.com/AWSEC2/latest/UserGuide/
            # stopping-a-spot-instance.html: only persistent requests can be stopped).
            ended, kept = _terminate(ec2, [instance_id])
            terminated += ended
            refused += kept
    return Enforcement(
        tuple(stopped),
        tuple(terminated),
        tuple(refused),
        fleet_stop_requested,
        held_jobs,
        tuple(problems),
    )


def _hold_jobs(
    settings: GuardSettings, ssm: Any, instances: list[dict[str, Any]], sleep: Callable
) -> tuple[int | None, str]:
    """Checkpoint and hold the cluster's jobs from its head node through SSM
    (infra/functions/slurm_queue.py), waiting at most HOLD_BOUND_S: (the jobs held, or None
    when it could not say; a problem to report).

    Run Command: SendCommand with AWS-RunShellScript, then GetCommandInvocation until the
    command has ended, which answers InvocationDoesNotExist for a moment after the send
    (SSM API Reference, SendCommand and GetCommandInvocation,
    docs.aws.amazon.com/systems-manager/latest/APIReference/).
    """
    head = next(
        (
            i["InstanceId"]
            for i in instances
            if _node_type(i) == HEAD_NODE and i["State"]["Name"] == BILLED_STATE
        ),
        None,
    )
    unheld = "its jobs end with the compute nodes, without a checkpoint"
    if not settings.cluster_queue:
        return None, f"the guard does not know cluster {settings.cluster_name}'s queue: {unheld}"
    if head is None:
        return None, f"cluster {settings.cluster_name}'s head node is not running: {unheld}"
    if ssm is None:
        return None, f"the guard cannot reach cluster {settings.cluster_name}'s head node: {unheld}"
    script = hold_script(settings.cluster_queue, JOB_END_WAIT_S)
    try:
        command_id = ssm.send_command(
            InstanceIds=[head],
            DocumentName="AWS-RunShellScript",
            Parameters={"commands": [script]},
            TimeoutSeconds=HOLD_BOUND_S,
            Comment="spend guard: checkpoint and hold the queue before the budget stop",
        )["Command"]["CommandId"]
        waited = 0.0
        while True:
            try:
                reply = ssm.get_command_invocation(CommandId=command_id, InstanceId=head)
            except ssm.exceptions.InvocationDoesNotExist:
                reply = {"Status": "Pending"}
            if reply["Status"] in SSM_ENDED or waited >= HOLD_BOUND_S:
                break
            sleep(HOLD_POLL_S)
            waited += HOLD_POLL_S
    except (ClientError, BotoCoreError) as exc:
        return None, f"could not hold cluster {settings.cluster_name}'s jobs ({exc}): {unheld}"
    if reply["Status"] != "Success":
        why = reply.get("StandardErrorContent", "").strip()[-300:] or reply["Status"]
        return None, f"holding cluster {settings.cluster_name}'s jobs ended: {why}; {unheld}"
    # hold_script prints the queue: id|name|state|nodes|elapsed|priority|reason
    lines = [line.split("|") for line in reply.get("StandardOutputContent", "").splitlines()]
    return sum(1 for fields in lines if len(fields) > 5 and fields[5] == "0"), ""


def _terminate(ec2: Any, instance_ids: list[str]) -> tuple[list[str], list[str]]:
    """(terminated, "id (error code)" refused), one at a time so one refusal stops no other."""
    ended, refused = [], []
    for instance_id in instance_ids:
        try:
            ec2.terminate_instances(InstanceIds=[instance_id])
            ended.append(instance_id)
        except ClientError as exc:
            refused.append(f"{instance_id} ({exc.response['Error']['Code']})")
    return ended, refused


def _request_fleet_stop(
    dynamodb: Any, cluster_name: str, now: datetime.datetime
) -> tuple[bool, str]:
    """What `pcluster update-compute-fleet --status STOP_REQUESTED` does (infra/functions/
    fleet.py): clustermgtd then terminates the compute nodes and sets the partitions INACTIVE.
    Returns (whether this run requested it, a problem to report).
    """
    try:
        fleet.request_stop(dynamodb, cluster_name, now)
        return True, ""
    except ClientError as exc:
        code = exc.response["Error"]["Code"]
        if code == fleet.CONDITION_FAILED:  # already stopping or stopped, or no status yet
            return False, ""
        return False, (
            f"could not set cluster {cluster_name}'s compute fleet to STOP_REQUESTED ({code}); "
            "its compute nodes are terminated all the same"
        )


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
    enforcement: Enforcement | None,
    problems: Iterable[str],
) -> list[tuple[str, str]]:
    """(subject, message) for each threshold newly passed, what this run ended, and each
    problem it met."""
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
    done = enforcement or Enforcement()
    if done.stopped:
        notices.append(
            (
                f"{stack}: spend guard stopped {len(done.stopped)} instance(s)",
                f"Stopped {', '.join(done.stopped)} because {ledger.stop_reason}. Their volumes "
                "are kept. The guard stops them again until the budget (gpu:budgetUsd) is "
                "raised or the period ends.",
            )
        )
    if done.terminated:
        fleet_note = (
            f" Cluster {settings.cluster_name}'s compute fleet is STOP_REQUESTED: start it again "
            "with `python -m infra start` once the budget allows."
            if done.fleet_stop_requested
            else ""
        )
        if done.held_jobs is not None:
            fleet_note = (
                f" {done.held_jobs} job(s) checkpointed and held first; `start` releases "
                f"them.{fleet_note} Its NAT gateway bills on until `python -m infra down`."
            )
        notices.append(
            (
                f"{stack}: spend guard terminated {len(done.terminated)} node(s)",
                f"Terminated {', '.join(done.terminated)} (compute nodes, or spot instances EC2 "
                f"cannot stop) because {ledger.stop_reason}.{fleet_note}",
            )
        )
    if done.refused:
        notices.append(
            (
                f"{stack}: spend guard could not stop {len(done.refused)} instance(s)",
                f"EC2 refused to stop {', '.join(done.refused)}, which should stop because "
                f"{ledger.stop_reason}. Stop or terminate them yourself.",
            )
        )
    notices += [(f"{stack}: spend guard problem", problem) for problem in problems]
    return [(subject[:100], message) for subject, message in notices]  # SNS: subject <= 100


def _publish(sns: Any, topic_arn: str, notice: tuple[str, str]) -> bool:
    """Publish one notice; False (kept for the next run) when SNS did not take it."""
    subject, message = notice
    try:
        sns.publish(TopicArn=topic_arn, Subject=subject, Message=message)
        return True
    except (ClientError, BotoCoreError):
        return False


def _read_before(
    dynamodb: Any, table: str, period: str, start: datetime.datetime, now: datetime.datetime
) -> tuple[Ledger, str]:
    """The period's ledger and "" or, for an item the guard cannot trust, what is wrong with
    it and a ledger rebuilt from it: what it still says of the spend and notices, counted
    again from the period's start (see `_account`)."""
    item = read_item(dynamodb, table, period)
    if item is None:
        return _opening(period, start), ""
    try:
        ledger = from_item(item)
        accounted_until = ledger.accounted_until_time
        if accounted_until.tzinfo is None or not math.isfinite(ledger.spent_usd):
            raise ValueError("a number or a time it cannot use")
        if accounted_until > now + FUTURE_TOLERANCE:
            problem = f"its accounted_until {ledger.accounted_until} is in the future"
        else:
            return ledger, ""
    except (KeyError, ValueError, TypeError, IndexError, AttributeError) as exc:
        problem = f"{type(exc).__name__}: {exc}"
    spent = _salvage(lambda: float(item["spent_usd"]["N"]), 0.0)
    return (
        dataclasses.replace(
            _opening(period, start),
            spent_usd=spent if math.isfinite(spent) and spent > 0 else 0.0,
            notified_thresholds=_salvage(
                lambda: tuple(float(t["N"]) for t in item["notified_thresholds"]["L"]), ()
            ),
            prepaid_blocks=_salvage(lambda: tuple(b["S"] for b in item["prepaid_blocks"]["L"]), ()),
            version=_salvage(lambda: int(item["version"]["N"]), 0),
        ),
        problem,
    )


def _salvage(read: Any, default: Any) -> Any:
    try:
        return read()
    except (KeyError, ValueError, TypeError, IndexError, AttributeError):
        return default


def _error_code(exc: Exception) -> str:
    """EC2/DynamoDB's error code, or the kind of failure when the service never answered."""
    if isinstance(exc, ClientError):
        return exc.response["Error"]["Code"]
    return type(exc).__name__


def _unreadable_notice(period: str, problem: str) -> str:
    return (
        f"the ledger item of period {period} could not be used ({problem}); it was replaced "
        "by one counted from EC2's running times since the period began (or what the item "
        "still said, if more), so spend before the last start of each instance may be missing"
    )


def _capacity_block_fee(
    settings: GuardSettings, ec2: Any, before: Ledger
) -> tuple[tuple[str, float] | None, str]:
    """The stack's Capacity Block fee, to count once, up front: (block id, $) or None, and a
    problem to report.

    A block is paid when bought, for all its hours and instances ("Capacity Blocks pricing",
    aws.amazon.com/ec2/capacityblocks/pricing/); EC2 gives its dates and size as a capacity
    reservation (DescribeCapacityReservations: StartDate, EndDate, TotalInstanceCount,
    docs.aws.amazon.com/AWSEC2/latest/APIReference/API_CapacityReservation.html).
    """
    block = settings.capacity_block_id
    if not block or block in before.prepaid_blocks:
        return None, ""
    try:
        (reservation,) = ec2.describe_capacity_reservations(CapacityReservationIds=[block])[
            "CapacityReservations"
        ]
        hours = (
            _aware(reservation["EndDate"]) - _aware(reservation["StartDate"])
        ).total_seconds() / 3600
        instance_type = reservation["InstanceType"]
        count = int(reservation["TotalInstanceCount"])
    except (ClientError, BotoCoreError, KeyError, ValueError) as exc:
        return None, (
            f"could not read Capacity Block {block} ({exc}); its instances are counted by "
            "their running time at the block's rate until it can"
        )
    rate = settings.price(instance_type, Market.CAPACITY_BLOCK)
    if rate is None:
        return None, f"no capacity-block price for {instance_type}: block {block} is not counted"
    return (block, hours * count * rate), ""


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
