"""A resolved Plan, and what its stack costs, as the text `python -m infra plan` prints."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from infra.knowledge.costs import SPEND_GUARD_PERIOD_MINUTES, SPEND_GUARD_TIMEOUT_SECONDS
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
        f"AMI family     {ami.name} ({ami.os}, end of life {ami.end_of_life.isoformat()})",
        f"SSM parameter  {ami.ssm_parameter}",
        f"driver         {ami.driver_version} ({ami.driver_kind}; image needs "
        f">= {variant.min_driver})",
        f"image variant  {variant.name} (CUDA {variant.cuda}, torch {variant.torch}, "
        f"cuDNN {variant.cudnn}, NCCL {variant.nccl}, DeepSpeed {variant.deepspeed})",
        f"image tag      {plan.image_tag}",
        f"on-demand      ${plan.on_demand_usd_per_hour:.2f}/h "
        f"({rate.to_cny(plan.on_demand_usd_per_hour):.0f} CNY/h)",
        f"spot           ${plan.spot_usd_per_hour:.2f}/h "
        f"({rate.to_cny(plan.spot_usd_per_hour):.0f} CNY/h)",
    ]
    if profile is not None and profile.guide_cny_per_hour is not None:
        low, high = profile.guide_cny_per_hour
        lines.append(f"guide range    {low:g}-{high:g} CNY/h (GPU-cloud selection guide)")
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


def format_costs(costs: Mapping[str, Any]) -> str:
    """A cost summary (infra.knowledge.costs.cost_summary), to follow format_plan's lines
    (which give the stack's $/h in both markets).
    """
    market, hours = costs["market"], costs["max_runtime_hours"]
    period = "a day" if costs["budget_period"] == "DAILY" else "a month"
    budget = f"${costs['budget_usd']:,.2f} {period}"
    if costs["budget_period"] == "DAILY":
        budget += f" (${costs['monthly_budget_usd']:,.2f} a month)"
    lines = [
        f"market         {market}: ${costs['hourly_usd']:.2f}/h for the stack",
        f"budget         {budget}",
        f"runway         {costs['runway_hours']:.1f} h {period} at full load {market} "
        f"(on-demand {costs['runway_hours_on_demand']:.1f} h, "
        f"spot {costs['runway_hours_spot']:.1f} h)",
        f"overspend      at most ${costs['worst_case_overspend_usd']:,.2f} past the budget: "
        f"the spend guard checks every {SPEND_GUARD_PERIOD_MINUTES} min and stops the stack "
        f"within {SPEND_GUARD_TIMEOUT_SECONDS} s",
    ]
    if hours is not None:
        lines.append(
            f"longest run    ${costs['max_run_usd']:,.2f} {market}: gpu:maxRuntimeHours "
            f"stops each node after {hours:g} h"
        )
    return "\n".join(lines)
