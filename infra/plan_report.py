"""A resolved Plan as the text `python -m infra plan` prints."""

from __future__ import annotations

from infra.profiles import ExchangeRate, Profile
from infra.resolver import Plan


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
    if profile is not None and profile.seed_cny_per_hour is not None:
        low, high = profile.seed_cny_per_hour
        lines.append(f"seed range     {low:g}-{high:g} CNY/h")
    lines.append(
        f"prices         {instance.prices_checked.isoformat()}, us-east-1; "
        f"CNY at {rate.cny_per_usd} per USD ({rate.as_of.isoformat()})"
    )
    if profile is not None:
        lines.append(f"why            {profile.mapping}")
    lines += [f"warning        {warning}" for warning in plan.warnings]
    return "\n".join(lines)
