"""What the command line prints: a resolved Plan, what its stack costs, aligned tables."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from common.market import Market
from infra.cluster.config import QUEUE, SCALEDOWN_IDLE_MINUTES
from infra.knowledge.costs import (
    SPEND_GUARD_PERIOD_MINUTES,
    CostSummary,
    IdleCost,
)
from infra.knowledge.parallelcluster import ParallelCluster
from infra.knowledge.profiles import ExchangeRate, Profile
from infra.knowledge.resolver import Plan


def format_plan(plan: Plan, *, profile: Profile | None, rate: ExchangeRate) -> str:
    instance, variant, ami = plan.instance, plan.variant, plan.ami
    lines = []
    if profile is not None:
        lines += [f"profile        {profile.name}: {profile.description}"]
    lines += [
        f"instance       {plan.nodes} x {instance.type}",
        f"GPUs           {plan.gpus} x {instance.gpu_model} {instance.gpu_memory_gib} GiB "
        f"(compute capability {instance.compute_capability}, {instance.gpu_interconnect})",
        f"EFA            {instance.efa_interfaces} interface(s) per node",
    ]
    if plan.cluster is None:  # a cluster's nodes boot ParallelCluster's AMIs: format_cluster
        lines += [
            f"AMI family     {ami.name} ({ami.os}, end of life {ami.end_of_life.isoformat()})",
            f"SSM parameter  {ami.ssm_parameter}",
            f"driver         {ami.driver_version} ({ami.driver_kind}; image needs "
            f">= {variant.min_driver})",
        ]
    lines += [
        f"image variant  {variant.name} (CUDA {variant.cuda}, torch {variant.torch}, "
        f"cuDNN {variant.cudnn}, NCCL {variant.nccl}, DeepSpeed {variant.deepspeed})",
        f"image tag      {plan.image_tag}",
        f"on-demand      ${plan.on_demand_usd_per_hour:,.2f}/h "
        f"({rate.to_cny(plan.on_demand_usd_per_hour):,.0f} CNY/h)",
        f"spot           ${plan.spot_usd_per_hour:,.2f}/h "
        f"({rate.to_cny(plan.spot_usd_per_hour):,.0f} CNY/h)",
    ]
    if profile is not None and profile.guide_row is not None:
        price_range = ""
        if profile.guide_cny_per_hour is not None:
            low, high = profile.guide_cny_per_hour
            price_range = f", {low:g}-{high:g} CNY/h"
        lines.append(f"guide row      {profile.guide_row}{price_range} (GPU-cloud selection guide)")
    if profile is not None and profile.guide_hardware_gone is not None:
        lines.append(f"guide hardware {profile.guide_hardware_gone}")
    price = plan.price
    estimated = " (estimates)" if price.estimated else ""
    lines.append(
        f"prices         {price.region}{estimated}, checked {price.checked.isoformat()}; "
        f"CNY at {rate.cny_per_usd} per USD ({rate.as_of.isoformat()})"
    )
    if profile is not None:
        lines.append(f"why            {profile.mapping}")
    lines += [f"warning        {warning}" for warning in plan.warnings]
    return "\n".join(lines)


def format_cluster(plan: Plan, parallelcluster: ParallelCluster) -> str:
    """The Slurm cluster a multi-node plan runs on (gpu:cluster: slurm), and its idle cost at
    the head node's and the network's prices in the plan's region."""
    release, instance, region = plan.cluster, plan.instance, plan.price.region
    head_node = parallelcluster.head_node
    price = head_node.price_in(region)
    network = parallelcluster.network.price_in(region)
    estimated = " (estimate)" if price.on_demand_estimated else ""
    network_estimated = " (estimate)" if network.estimated else ""
    return "\n".join(
        [
            f"cluster        Slurm on AWS ParallelCluster {release.version} (AMIs with NVIDIA "
            f"driver {release.driver_version}; image needs >= {plan.variant.min_driver})",
            f"queue          {QUEUE}: 0 to {plan.nodes} x {instance.type}, nodes start for a job "
            f"and stop after {SCALEDOWN_IDLE_MINUTES} min idle",
            f"head node      {head_node.instance_type} on-demand, "
            f"${price.on_demand_usd_per_hour:.3f}/h in {region}{estimated}",
            f"network        NAT gateway and its address, "
            f"${parallelcluster.network_usd_per_hour(region):.3f}/h"
            f"{network_estimated}",
            f"idle cost      ${parallelcluster.idle_usd_per_hour(region):.3f}/h (head node and "
            "network: no job, no compute nodes)",
        ]
    )


def format_costs(costs: CostSummary) -> str:
    """A cost summary (infra.knowledge.costs.cost_summary), to follow format_plan's lines
    (which give the stack's $/h in both markets).
    """
    market, hours = costs.market, costs.max_runtime_hours
    period = "a day" if costs.budget_period == "DAILY" else "a month"
    budget = f"${costs.budget_usd:,.2f} {period}"
    if costs.budget_period == "DAILY":
        budget += f" (${costs.monthly_budget_usd:,.2f} a month)"
    lines = [
        f"market         {market}: ${costs.hourly_usd:,.2f}/h for the stack",
        f"budget         {budget}",
        f"runway         {costs.runway_hours:,.1f} h {period} at full load {market} "
        f"(on-demand {costs.runway_hours_on_demand:,.1f} h, "
        f"spot {costs.runway_hours_spot:,.1f} h)",
        f"overspend      at most ${costs.worst_case_overspend_usd:,.2f} past the budget: "
        f"the spend guard checks every {SPEND_GUARD_PERIOD_MINUTES} min and stops the stack "
        f"within {costs.guard_timeout_s} s"
        if costs.worst_case_overspend_usd is not None
        else "overspend      none: the block is paid up front; the spend guard counts its fee "
        "once and never stops its nodes",
    ]
    if hours is not None:
        lines.append(
            f"longest run    ${costs.max_run_usd:,.2f} {market}: gpu:maxRuntimeHours "
            f"stops each node after {hours:g} h"
        )
    return "\n".join(lines)


def format_idle(idle: IdleCost) -> str:
    """The stack's standing cost (infra.knowledge.costs.idle_cost): what it bills with no job."""
    parts = [
        f"root volumes ${idle.root_volumes_usd:,.2f}" if idle.root_volumes_usd else "",
        f"head node ${idle.head_node_usd:,.2f}" if idle.head_node_usd else "",
        f"network ${idle.network_usd:,.2f}",
    ]
    return (
        f"idle           ${idle.total_usd:,.2f} a month with no job running "
        f"({', '.join(p for p in parts if p)}), plus "
        f"${idle.checkpoint_usd_per_100_gib:,.2f} a month per 100 GiB of checkpoints kept"
    )


def format_table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """Plain text columns: each as wide as its widest cell, numbers right-aligned."""
    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in r] for r in rows]
    numeric = [
        all(_is_number(row[i]) for row in cells[1:] if row[i]) and len(cells) > 1
        for i in range(len(headers))
    ]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = []
    for row in cells:
        parts = [
            cell.rjust(width) if right else cell.ljust(width)
            for cell, width, right in zip(row, widths, numeric, strict=True)
        ]
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)


def _is_number(text: str) -> bool:
    return text.lstrip("$").replace(",", "").replace(".", "", 1).lstrip("-").isdigit()


def format_cost_table(costs: CostSummary) -> str:
    """Both markets side by side for the stack (cost_summary), the one it runs in marked."""
    period = "a day" if costs.budget_period == "DAILY" else "a month"
    rows = [
        (
            "on-demand" + (" *" if costs.market is Market.ON_DEMAND else ""),
            f"${costs.on_demand_usd_per_hour:,.2f}",
            f"{costs.runway_hours_on_demand:,.1f} h",
        ),
        (
            "spot" + (" *" if costs.market is Market.SPOT else ""),
            f"${costs.spot_usd_per_hour:,.2f}",
            f"{costs.runway_hours_spot:,.1f} h",
        ),
    ]
    if costs.market not in (Market.ON_DEMAND, Market.SPOT):  # a Capacity Block or a reservation
        rows.append(
            (
                f"{costs.market} *",
                f"${costs.hourly_usd:,.2f}",
                f"{costs.runway_hours:,.1f} h",
            )
        )
    lines = [
        format_table(("MARKET", "$/H, ALL NODES", f"RUNWAY OF ${costs.budget_usd:,.2f}"), rows),
        f"* this stack's market; runway: hours of full load one budget ({period}) buys",
    ]
    lines.append(
        f"worst case: ${costs.worst_case_overspend_usd:,.2f} past the budget before the "
        "spend guard's stop takes hold"
        if costs.worst_case_overspend_usd is not None
        else "worst case: the block is paid up front; the spend guard never stops its nodes"
    )
    if costs.max_run_usd is not None:
        lines.append(
            f"longest run: ${costs.max_run_usd:,.2f} (gpu:maxRuntimeHours "
            f"{costs.max_runtime_hours:g} h)"
        )
    return "\n".join(lines)
