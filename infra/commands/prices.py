"""`python -m infra prices [--refresh]`: show a region's prices, or refresh them from AWS.

Shown from infra/knowledge/data/prices.toml (and the region's EBS and public IPv4 rates from
volume_and_address_prices.toml); `--refresh` rewrites prices.toml from AWS's
Price List API and spot price history (infra/knowledge/price_refresh.py says how). The
refresh needs AWS credentials (boto3's usual chain); showing works offline.
"""

from __future__ import annotations

import argparse
import datetime
from pathlib import Path

from infra.errors import ConfigError
from infra.knowledge.catalog import CATALOG_DIR, load_catalog
from infra.knowledge.price_refresh import PRICE_LIST_REGION, refresh
from infra.knowledge.prices import VOLUME_AND_ADDRESS_PRICES_FILE, PriceTable


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--refresh", action="store_true", help="read fresh prices from AWS (needs credentials)"
    )
    parser.add_argument(
        "--region", action="append", help="region to show or refresh (repeatable; default all)"
    )
    parser.add_argument(
        "--catalog", type=Path, default=CATALOG_DIR, help="catalog directory with prices.toml"
    )


def run(args: argparse.Namespace) -> str:
    catalog = load_catalog(args.catalog)
    regions = args.region or sorted(catalog.prices.regions)
    if not args.refresh:
        return "\n".join(_show(catalog.prices, region) for region in regions)
    import boto3  # only the refresh talks to AWS

    session = boto3.Session()
    if session.get_credentials() is None:
        raise ConfigError(
            "prices --refresh reads AWS's Price List API and needs AWS credentials; none "
            "were found (set AWS_PROFILE or run aws configure), so prices.toml is unchanged"
        )
    return refresh(
        args.catalog,
        regions,
        pricing=session.client("pricing", region_name=PRICE_LIST_REGION),
        ec2_for=lambda region: session.client("ec2", region_name=region),
        now=datetime.datetime.now(datetime.UTC),
    )


def _show(prices: PriceTable, region: str) -> str:
    """The region's instance prices, then what bills beside them (EBS, public IPv4)."""
    lines = [f"{region}"]
    for instance_type, price in prices.region(region).items():
        marks = " (estimate)" if price.estimated else ""
        block = price.capacity_block_usd_per_hour
        lines.append(
            f"  {instance_type:<15} on-demand ${price.on_demand_usd_per_hour:>8.3f}/h  "
            f"spot ${price.spot_usd_per_hour:>7.3f}/h  "
            + (f"block ${block:>7.3f}/h  " if block is not None else " " * 18)
            + f"checked {price.checked}{marks}"
        )
    beside = prices.volumes_and_addresses_by_region.get(region)
    if beside is None:
        lines.append(
            f"  no EBS and public IPv4 rates: add them to {VOLUME_AND_ADDRESS_PRICES_FILE}"
        )
        return "\n".join(lines)
    ebs = ", ".join(f"{kind} ${rate:g}" for kind, rate in beside.ebs_usd_per_gb_month.items())
    marks = " (EBS estimates)" if beside.ebs_estimated else ""
    lines.append(
        f"  EBS per GB-month: {ebs}; public IPv4 ${beside.public_ipv4_usd_per_hour:g}/h  "
        f"checked {beside.checked}{marks}"
    )
    return "\n".join(lines)
