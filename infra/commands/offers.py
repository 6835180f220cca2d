"""`offers`: every catalog instance type priced in a region, cheapest first, with what runs on it.

Answers "what is the cheapest way to get 8x A100 80GB here": GPU model, count,
memory and interconnect, on-demand, spot and capacity-block $/h (prices.toml), the
image variants an AMI of the catalog runs on it (infra/knowledge/resolver.py), and
the profile that uses the type. A type without a price in the region is left out
(AWS does not offer it there). Offline: the catalog's data files only.
"""

from __future__ import annotations

import argparse
import datetime
import math
from dataclasses import dataclass

from common.market import PRICED_MARKETS, Market
from images.matrix import load_matrix
from infra.config.stack_file import stack_file_path, stack_file_region
from infra.errors import ConfigError
from infra.knowledge.catalog import Catalog, Instance, load_catalog
from infra.knowledge.prices import InstancePrice
from infra.knowledge.profiles import load_profiles
from infra.knowledge.resolver import DEFAULT_PLAN_REGION, runnable_variants
from infra.report import format_table

HEADERS = (
    "TYPE", "GPU", "GPUS", "GIB/GPU", "LINK",
    "ON-DEMAND", "SPOT", "CAP-BLOCK", "VARIANTS", "PROFILE",
)  # fmt: skip


@dataclass(frozen=True)
class Offer:
    instance: Instance
    price: InstancePrice
    variants: tuple[str, ...]
    profiles: tuple[str, ...]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gpu", help="GPU model, e.g. A100, H100, V100, L40S (any case)")
    parser.add_argument("--min-gpus", type=int, default=1, help="at least this many GPUs")
    parser.add_argument(
        "--market",
        choices=[market.value for market in PRICED_MARKETS],
        default=Market.ON_DEMAND.value,
        help="sort and cap by this market's price; a type without one is left out "
        "(default on-demand)",
    )
    parser.add_argument(
        "--spot",
        dest="market",
        action="store_const",
        const=Market.SPOT.value,
        help="the same as --market spot",
    )
    parser.add_argument("--max-price", type=float, help="at most this many USD per hour")
    parser.add_argument(
        "--region",
        help="AWS region (default: the default stack file's aws:region, else "
        f"{DEFAULT_PLAN_REGION})",
    )


def run(args: argparse.Namespace) -> str:
    """Instance types cheapest first, with GPUs, prices, image variants and profile."""
    region = args.region or _default_region()
    market = Market(args.market)
    chosen = select_offers(
        load_catalog(),
        gpu=args.gpu,
        min_gpus=args.min_gpus,
        market=market,
        max_price=args.max_price,
        region=region,
    )
    if not chosen:
        return f"no instance type in the catalog matches (prices by {market}, {region})"
    table = format_table(HEADERS, [_row(offer) for offer in chosen])
    dates = sorted({offer.price.checked.isoformat() for offer in chosen})
    notes = [
        f"USD per hour per instance, {region}, sorted by {market}; prices checked "
        f"{', '.join(dates)} (infra/knowledge/data/prices.toml).",
        "* on-demand predates AWS's June 2025 P-family price cut (an upper bound); "
        "~ an estimate, not an observed figure for this region.",
    ]
    return "\n".join([table, "", *notes])


def _default_region() -> str:
    path = stack_file_path(load_profiles().default)
    return (stack_file_region(path) if path.is_file() else None) or DEFAULT_PLAN_REGION


def select_offers(
    catalog: Catalog,
    *,
    gpu: str | None = None,
    min_gpus: int = 1,
    market: Market = Market.ON_DEMAND,
    max_price: float | None = None,
    region: str = DEFAULT_PLAN_REGION,
    today: datetime.date | None = None,
) -> list[Offer]:
    """The types priced in `region` and in `market` that pass the filters, by that price."""
    try:
        prices = catalog.prices.region(region)
    except ConfigError as exc:
        raise ConfigError(f"--region {region}: {exc}") from None
    if min_gpus < 1:
        raise ConfigError(f"--min-gpus is {min_gpus}: give 1 or more")
    if max_price is not None and not (math.isfinite(max_price) and max_price > 0):
        raise ConfigError(
            f"--max-price is {max_price:g}: give a price above 0 (USD per hour), "
            "or leave it out for no cap"
        )
    models = sorted({i.gpu_model for i in catalog.instances.values()})
    if gpu is not None and gpu.upper() not in {m.upper() for m in models}:
        raise ConfigError(f"--gpu {gpu!r} is not in the catalog: use one of {', '.join(models)}")
    matrix = load_matrix()
    today = today if today is not None else datetime.date.today()
    profiles = load_profiles()

    def price(instance: Instance) -> float:
        return prices[instance.type].by_market()[market]

    kept = [
        instance
        for instance in catalog.instances.values()
        if instance.type in prices
        and market in prices[instance.type].by_market()
        and (gpu is None or instance.gpu_model.upper() == gpu.upper())
        and instance.gpu_count >= min_gpus
        and (max_price is None or price(instance) <= max_price)
    ]
    kept.sort(key=lambda instance: (price(instance), instance.type))
    return [
        Offer(
            instance=instance,
            price=prices[instance.type],
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
    i, p = offer.instance, offer.price
    on_demand = (
        f"${p.on_demand_usd_per_hour:,.2f}"
        + ("*" if p.on_demand_upper_bound else "")
        + ("~" if p.on_demand_estimated else "")
    )
    spot = f"${p.spot_usd_per_hour:,.2f}" + ("~" if p.spot_estimated else "")
    block = f"${p.capacity_block_usd_per_hour:,.2f}" if p.capacity_block_usd_per_hour else "-"
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
