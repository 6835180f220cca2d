"""`offers`: every catalog instance type for a region, cheapest first, with what runs on it.

Answers "what is the cheapest way to get 8x A100 80GB here": GPU model, count,
memory and interconnect, on-demand, spot and capacity-block $/h, the image
variants whose driver needs an AMI of the catalog meets (infra/knowledge/resolver.py),
and the profile that uses the type. Offline: the catalog's data files only.
"""

from __future__ import annotations

import argparse
import datetime
from dataclasses import dataclass

from images.matrix import load_matrix
from infra.errors import ConfigError
from infra.knowledge.catalog import Catalog, Instance, load_catalog
from infra.knowledge.profiles import load_profiles
from infra.knowledge.resolver import runnable_variants
from infra.report import format_table

HEADERS = (
    "TYPE", "GPU", "GPUS", "GIB/GPU", "LINK",
    "ON-DEMAND", "SPOT", "CAP-BLOCK", "VARIANTS", "PROFILE",
)  # fmt: skip


@dataclass(frozen=True)
class Offer:
    instance: Instance
    variants: tuple[str, ...]
    profiles: tuple[str, ...]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gpu", help="GPU model, e.g. A100, H100, V100, L40S (any case)")
    parser.add_argument("--min-gpus", type=int, default=1, help="at least this many GPUs")
    parser.add_argument(
        "--spot", action="store_true", help="sort and cap by the spot price instead of on-demand"
    )
    parser.add_argument("--max-price", type=float, help="at most this many USD per hour")
    parser.add_argument("--region", help="AWS region (default: the catalog's region)")


def run(args: argparse.Namespace) -> str:
    """Instance types cheapest first, with GPUs, prices, image variants and profile."""
    catalog = load_catalog()
    chosen = select_offers(
        catalog,
        gpu=args.gpu,
        min_gpus=args.min_gpus,
        spot=args.spot,
        max_price=args.max_price,
        region=args.region,
    )
    market = "spot" if args.spot else "on-demand"
    if not chosen:
        return f"no instance type in the catalog matches (prices by {market}, {catalog.region})"
    table = format_table(
        HEADERS,
        [_row(offer) for offer in chosen],
    )
    dates = sorted({offer.instance.prices_checked.isoformat() for offer in chosen})
    notes = [
        f"USD per hour per instance, {catalog.region}, sorted by {market}; prices checked "
        f"{', '.join(dates)}.",
        "* on-demand predates AWS's June 2025 P-family price cut (an upper bound); "
        "~ spot is an estimate (30% of on-demand).",
    ]
    return "\n".join([table, "", *notes])


def select_offers(
    catalog: Catalog,
    *,
    gpu: str | None = None,
    min_gpus: int = 1,
    spot: bool = False,
    max_price: float | None = None,
    region: str | None = None,
    today: datetime.date | None = None,
) -> list[Offer]:
    """The catalog's types that pass the filters, by price in the chosen market (then type)."""
    if region is not None and region != catalog.region:
        raise ConfigError(
            f"the catalog prices {catalog.region} only, not {region}: use --region "
            f"{catalog.region}, or add that region's prices to infra/knowledge/data/"
        )
    if min_gpus < 1:
        raise ConfigError(f"--min-gpus is {min_gpus}: give 1 or more")
    if max_price is not None and max_price <= 0:
        raise ConfigError(f"--max-price is {max_price:g}: give a price above 0 (USD per hour)")
    models = sorted({i.gpu_model for i in catalog.instances.values()})
    if gpu is not None and gpu.upper() not in {m.upper() for m in models}:
        raise ConfigError(f"--gpu {gpu!r} is not in the catalog: use one of {', '.join(models)}")
    matrix = load_matrix()
    today = today if today is not None else datetime.date.today()
    profiles = load_profiles()

    def price(instance: Instance) -> float:
        return instance.spot_usd_per_hour if spot else instance.on_demand_usd_per_hour

    kept = [
        instance
        for instance in catalog.instances.values()
        if (gpu is None or instance.gpu_model.upper() == gpu.upper())
        and instance.gpu_count >= min_gpus
        and (max_price is None or price(instance) <= max_price)
    ]
    kept.sort(key=lambda instance: (price(instance), instance.type))
    return [
        Offer(
            instance=instance,
            variants=tuple(v.name for v, _ in runnable_variants(instance, catalog, matrix, today)),
            profiles=tuple(
                name
                for name, profile in profiles.profiles.items()
                if profile.instance_type == instance.type
            ),
        )
        for instance in kept
    ]


def _row(offer: Offer) -> tuple[object, ...]:
    i = offer.instance
    on_demand = f"${i.on_demand_usd_per_hour:,.2f}" + ("*" if i.on_demand_upper_bound else "")
    spot = f"${i.spot_usd_per_hour:,.2f}" + ("~" if i.spot_estimated else "")
    block = f"${i.capacity_block_usd_per_hour:,.2f}" if i.capacity_block_usd_per_hour else "-"
    return (
        i.type,
        i.gpu_model,
        i.gpu_count,
        i.gpu_memory_gib,
        i.gpu_interconnect,
        on_demand,
        spot,
        block,
        ",".join(offer.variants) or "none",
        ",".join(offer.profiles) or "-",
    )
