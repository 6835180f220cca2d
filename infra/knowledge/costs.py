"""What a stack costs before it exists: $/h per market, the budget, and the runway it buys.

Pure: used by the offline plan and registered as stack outputs by the Guardrails component.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from common.market import Market
from infra.errors import ConfigError
from infra.functions.slurm_queue import HOLD_BOUND_S
from infra.knowledge.catalog import load_catalog
from infra.knowledge.parallelcluster import load_parallelcluster
from infra.knowledge.prices import VolumeAndAddressPrices

if TYPE_CHECKING:
    from infra.knowledge.resolver import Plan

DAYS_PER_MONTH = 365 / 12  # an average month, to put a daily budget next to a monthly one
PERIOD_HOURS = {"DAILY": 24.0, "MONTHLY": DAYS_PER_MONTH * 24}


def runway_hours(budget: float, hourly: float, period: str) -> float:
    """Hours of full load one budget buys, at most the budget period's own hours: a budget
    that outlasts its period buys the whole period, not more."""
    return round(min(budget / hourly, PERIOD_HOURS[period]), 1)


# The spend guard (infra/functions/spend_guard.py) runs every SPEND_GUARD_PERIOD_MINUTES and
# stops the stack in the run that finds the budget spent; a run lasts at most its function's
# timeout. EC2 bills no stopping instance (unless it hibernates: "Instance state and billing",
# docs.aws.amazon.com/AWSEC2/latest/UserGuide/ec2-instance-lifecycle.html), so the stack runs
# past its budget for at most one period plus one run.
SPEND_GUARD_PERIOD_MINUTES = 5
SPEND_GUARD_TIMEOUT_SECONDS = 60
# On a Slurm cluster a stop first holds the jobs, which checkpoint, for at most HOLD_BOUND_S
# (infra/functions/spend_guard.py, _hold_jobs): the run may last that much longer.
CLUSTER_SPEND_GUARD_TIMEOUT_SECONDS = SPEND_GUARD_TIMEOUT_SECONDS + HOLD_BOUND_S


def spend_guard_timeout_s(cluster: bool) -> int:
    """The spend guard's function timeout: one run's longest time."""
    return CLUSTER_SPEND_GUARD_TIMEOUT_SECONDS if cluster else SPEND_GUARD_TIMEOUT_SECONDS


# What the stack costs beside its instances, 730 hours a month. EBS storage, public IPv4
# addresses (volumes_and_addresses) and NAT gateways (data/parallelcluster.toml) are priced per
# region; the rest at us-east-1 list prices (other regions differ by a few percent).
HOURS_PER_MONTH = 730
# EBS snapshots ("Amazon EBS pricing", aws.amazon.com/ebs/pricing/).
SNAPSHOT_USD_PER_GB_MONTH = 0.05
# S3 Standard, first 50 TB a month ("Amazon S3 pricing", aws.amazon.com/s3/pricing/).
S3_STANDARD_USD_PER_GB_MONTH = 0.023
# CloudWatch Logs storage ("Amazon CloudWatch pricing", aws.amazon.com/cloudwatch/pricing/).
LOG_STORAGE_USD_PER_GB_MONTH = 0.03
# The stack's nodes' root volumes (infra/components/compute.py).
ROOT_VOLUME_TYPE = "gp3"


def volumes_and_addresses(region: str) -> VolumeAndAddressPrices:
    """`region`'s EBS and public IPv4 rates: the ones the spend guard counts with
    (infra/knowledge/data/volume_and_address_prices.toml)."""
    return load_catalog().prices.volumes_and_addresses(region)


def network_usd_per_hour(
    region: str, *, public_ipv4_addresses: int = 0, nat_gateways: int = 0
) -> float:
    """What leftover addresses and NAT gateways bill an hour in `region`, for `down`'s report,
    at the rates a planned cluster's network is priced with."""
    nat_gateway = load_parallelcluster().network.price_in(region).nat_gateway_usd_per_hour
    return (
        public_ipv4_addresses * volumes_and_addresses(region).public_ipv4_usd_per_hour
        + nat_gateways * nat_gateway
    )


@dataclass(frozen=True)
class IdleCost:
    """What a stack costs a month with no job running (its nodes stopped or not started)."""

    root_volumes_usd: float  # the nodes' root volumes: EBS bills stopped instances' volumes
    head_node_usd: float  # a cluster's head node (and its root volume) runs all the time
    network_usd: float
    checkpoint_usd_per_100_gib: float  # the bucket, per 100 GiB of checkpoints kept

    @property
    def total_usd(self) -> float:
        return self.root_volumes_usd + self.head_node_usd + self.network_usd


def idle_cost(
    plan: Plan,
    root_volume_gib: int,
    head_node_usd_per_hour: float | None = None,
    network_hourly_usd: float = 0.0,
) -> IdleCost:
    """`plan`'s standing cost. An EC2 stack's stopped nodes keep their root volumes and
    release their public IPv4 addresses (billed only while running); a cluster's compute
    nodes do not exist without a job, and its head node has no public address (ParallelCluster
    pre-creates its interface without one: cli/src/pcluster/templates/cluster_stack.py,
    _add_head_eni, v3.15.1)."""
    cluster = plan.cluster is not None
    ebs = volumes_and_addresses(plan.price.region).ebs_usd_per_gb_month
    return IdleCost(
        root_volumes_usd=(0.0 if cluster else plan.nodes * root_volume_gib * ebs[ROOT_VOLUME_TYPE]),
        head_node_usd=(head_node_usd_per_hour or 0.0) * HOURS_PER_MONTH,
        network_usd=network_hourly_usd * HOURS_PER_MONTH,
        checkpoint_usd_per_100_gib=100 * S3_STANDARD_USD_PER_GB_MONTH,
    )


def worst_case_overspend_usd(hourly: float, cluster: bool = False) -> float:
    """What the stack can spend past its budget before the spend guard's stop takes hold."""
    minutes = SPEND_GUARD_PERIOD_MINUTES + spend_guard_timeout_s(cluster) / 60
    return hourly * minutes / 60


def hourly_usd(plan: Plan, market: Market) -> float:
    """The stack's full-load $/h (all nodes) in `market`: the one price the plan, the budget
    check, the spend guard and status use.

    A Capacity Block's is its effective hourly rate (paid up front for the block's hours); a
    reservation's, the on-demand rate. A block the catalog cannot price is refused here, at
    preview, rather than found unpriced by the spend guard after launch.
    """
    if market is Market.SPOT:
        return plan.spot_usd_per_hour
    if market is Market.CAPACITY_BLOCK:
        rate = plan.price.capacity_block_usd_per_hour
        if rate is None:
            raise ConfigError(
                f"gpu:capacityBlockId is set, but the catalog has no capacity-block price for "
                f"{plan.instance.type} in {plan.price.region}, so the budget and the spend "
                "guard could not count the block; add capacity_block_usd_per_hour for it to "
                "infra/knowledge/data/prices.toml, or use a type with one"
            )
        return rate * plan.nodes
    return plan.on_demand_usd_per_hour


class Budget(Protocol):
    """The budget settings a cost summary needs (infra.config.guardrails.GuardrailConfig has
    them); a Protocol, so knowledge stays below config in the import graph."""

    @property
    def budget_usd(self) -> float: ...
    @property
    def budget_period(self) -> str: ...  # "MONTHLY" or "DAILY"
    @property
    def max_runtime_hours(self) -> float | None: ...


@dataclass(frozen=True)
class CostSummary:
    """What a stack costs: $/h of all its nodes per market, the budget and its runway.

    `runway_hours` is for the stack's `market`; the on-demand and spot runways are given too,
    so a reader that does not know the market still sees the shorter (on-demand) one.
    """

    instance_type: str
    nodes: int
    market: Market
    on_demand_usd_per_hour: float
    spot_usd_per_hour: float
    hourly_usd: float  # in `market`
    budget_usd: float
    budget_period: str  # "MONTHLY" or "DAILY"
    monthly_budget_usd: float
    runway_hours: float  # hours of full load the budget buys in `market`
    runway_hours_on_demand: float
    runway_hours_spot: float
    max_runtime_hours: float | None
    max_run_usd: float | None  # None: no gpu:maxRuntimeHours
    # None for a Capacity Block: its fee is all paid when bought, the guard has nothing to stop.
    worst_case_overspend_usd: float | None
    guard_timeout_s: int


def cost_summary(plan: Plan, config: Budget, *, market: Market = Market.ON_DEMAND) -> CostSummary:
    """Hourly cost on-demand and spot, the budget, and the runway: hours of full load it buys."""
    budget = config.budget_usd
    monthly_budget = budget * DAYS_PER_MONTH if config.budget_period == "DAILY" else budget
    on_demand = plan.on_demand_usd_per_hour
    spot_price = plan.spot_usd_per_hour
    hourly = hourly_usd(plan, market)
    max_hours = config.max_runtime_hours
    return CostSummary(
        instance_type=plan.instance.type,
        nodes=plan.nodes,
        market=market,
        on_demand_usd_per_hour=round(on_demand, 2),
        spot_usd_per_hour=round(spot_price, 2),
        hourly_usd=round(hourly, 2),
        budget_usd=budget,
        budget_period=config.budget_period,
        monthly_budget_usd=round(monthly_budget, 2),
        runway_hours=runway_hours(budget, hourly, config.budget_period),
        runway_hours_on_demand=runway_hours(budget, on_demand, config.budget_period),
        runway_hours_spot=runway_hours(budget, spot_price, config.budget_period),
        max_runtime_hours=max_hours,
        max_run_usd=None if max_hours is None else round(hourly * max_hours, 2),
        worst_case_overspend_usd=(
            None
            if market is Market.CAPACITY_BLOCK
            else round(worst_case_overspend_usd(hourly, plan.cluster is not None), 2)
        ),
        guard_timeout_s=spend_guard_timeout_s(plan.cluster is not None),
    )


def price_model(
    plan: Plan,
    *,
    market: Market,
    capacity_reservation_id: str | None = None,
    capacity_block_id: str | None = None,
) -> str:
    """How the stack's nodes are paid for in `market`, in one sentence (naming the
    reservation or block, when the market has one)."""
    on_demand = plan.on_demand_usd_per_hour
    if market is Market.CAPACITY_BLOCK:
        rate = plan.price.capacity_block_usd_per_hour
        quoted = (
            f"about ${rate * plan.nodes:.2f}/h for {plan.nodes} x {plan.instance.type} "
            f"(infra/knowledge/data/prices.toml, {plan.price.region})"
            if rate is not None
            else "at the block's own rate"
        )
        return (
            f"Capacity Block {capacity_block_id}: paid up front when bought, {quoted}, for "
            "the whole block whether the nodes run or not; running them adds nothing, and EC2 "
            "ends them with the block. The spend guard counts the block once, up front, and "
            "never stops its nodes (that would save nothing)"
        )
    if market is Market.RESERVATION:
        return (
            f"On-Demand Capacity Reservation {capacity_reservation_id}: ${on_demand:.2f}/h (the "
            "on-demand rate) from the reservation's start until it is cancelled, used or not; "
            "nodes running in it add nothing"
        )
    if market is Market.SPOT:
        return (
            f"spot: about ${plan.spot_usd_per_hour:.2f}/h while the nodes run (the spot price "
            "moves; interruptions stop them)"
        )
    return f"on-demand: ${on_demand:.2f}/h while the nodes run"
