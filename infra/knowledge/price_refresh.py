"""Refresh the catalog's prices from AWS (`python -m infra prices --refresh`).

The refresh reads on-demand prices from the AWS Price List API (`pricing.get_products`,
docs.aws.amazon.com/aws-cost-management/latest/APIReference/API_pricing_GetProducts.html) and
the spot price history (`ec2.describe_spot_price_history`, highest price of the last week in
any zone: conservative for budgets), like SkyPilot's AWS catalog fetcher, and rewrites the
region's tables in infra/knowledge/data/prices.toml with today's date and those sources. A type
the Price List does not offer in the region is left out of it. Capacity Block rates are not in
the Price List: they are kept as they were. The Slurm head node's on-demand price in each
refreshed region is rewritten the same way in parallelcluster.toml ([head_node.prices."R"]),
when the catalog directory has that file. The caller hands in the boto3 clients.
"""

from __future__ import annotations

import datetime
import json
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from infra.errors import ConfigError
from infra.knowledge.catalog import load_catalog
from infra.knowledge.parallelcluster import load_parallelcluster
from infra.knowledge.prices import PRICES_FILE, InstancePrice

# The Price List API answers in a few regions only; us-east-1 is one (API reference above).
PRICE_LIST_REGION = "us-east-1"
SPOT_HISTORY_DAYS = 7
# The plain Linux, shared-tenancy, pay-as-you-go offer of an instance type (Price List filters).
_ON_DEMAND_FILTERS = {
    "operatingSystem": "Linux",
    "tenancy": "Shared",
    "preInstalledSw": "NA",
    "capacitystatus": "Used",
    "licenseModel": "No License required",
}


def on_demand_prices(pricing: Any, region: str, instance_types: Iterable[str]) -> dict[str, float]:
    """type -> on-demand $/h in `region`, for the types the Price List offers there."""
    found = {}
    for instance_type in instance_types:
        filters = {**_ON_DEMAND_FILTERS, "instanceType": instance_type, "regionCode": region}
        response = pricing.get_products(
            ServiceCode="AmazonEC2",
            Filters=[{"Type": "TERM_MATCH", "Field": k, "Value": v} for k, v in filters.items()],
        )
        prices = [
            float(dimension["pricePerUnit"]["USD"])
            for product in response["PriceList"]
            for term in json.loads(product)["terms"].get("OnDemand", {}).values()
            for dimension in term["priceDimensions"].values()
            if float(dimension["pricePerUnit"]["USD"]) > 0
        ]
        if prices:
            found[instance_type] = max(prices)
    return found


def spot_prices(
    ec2: Any, instance_types: Iterable[str], now: datetime.datetime
) -> dict[str, float]:
    """type -> the highest Linux spot $/h of the last SPOT_HISTORY_DAYS in any zone."""
    pages = ec2.get_paginator("describe_spot_price_history").paginate(
        InstanceTypes=list(instance_types),
        ProductDescriptions=["Linux/UNIX"],
        StartTime=now - datetime.timedelta(days=SPOT_HISTORY_DAYS),
        EndTime=now,
    )
    found: dict[str, float] = {}
    for page in pages:
        for entry in page["SpotPriceHistory"]:
            price = float(entry["SpotPrice"])
            found[entry["InstanceType"]] = max(price, found.get(entry["InstanceType"], 0.0))
    return found


def refreshed_region(
    region: str,
    on_demand: Mapping[str, float],
    spot: Mapping[str, float],
    previous: Mapping[str, InstancePrice],
    today: datetime.date,
) -> dict[str, dict[str, Any]]:
    """The region's prices.toml tables from fresh figures; spot falls back to an estimate."""
    tables = {}
    for instance_type, price in sorted(on_demand.items()):
        observed = spot.get(instance_type)
        spot_price = min(observed, price) if observed else round(0.3 * price, 4)
        sources = {
            "on_demand": f"AWS Price List API (pricing.get_products, regionCode {region}, "
            f"Linux, shared tenancy), read {today.isoformat()}",
            "spot": (
                f"EC2 spot price history (describe_spot_price_history, Linux/UNIX), highest "
                f"in the {SPOT_HISTORY_DAYS} days to {today.isoformat()}"
                if observed
                else "estimate: 30% of on-demand, no spot price history in the region"
            ),
        }
        table: dict[str, Any] = {
            "on_demand_usd_per_hour": price,
            "spot_usd_per_hour": spot_price,
            "on_demand_upper_bound": False,
            "on_demand_estimated": False,
            "spot_estimated": not observed,
            "checked": today,
        }
        kept = previous.get(instance_type)
        if kept is not None and kept.capacity_block_usd_per_hour is not None:
            table["capacity_block_usd_per_hour"] = kept.capacity_block_usd_per_hour
            sources["capacity_block"] = kept.sources.capacity_block
        tables[instance_type] = {**table, "sources": sources}
    return tables


def render(regions: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> str:
    """prices.toml's tables, in the file's own layout."""
    lines = []
    for region, tables in regions.items():
        for instance_type, table in tables.items():
            lines.append(f'[region."{region}"."{instance_type}"]')
            lines += [
                f"{key} = {_value(value)}" for key, value in table.items() if key != "sources"
            ]
            lines += ["", f'[region."{region}"."{instance_type}".sources]']
            lines += [
                f"{key} = {_value(value)}" for key, value in table["sources"].items() if value
            ]
            lines.append("")
    return "\n".join(lines)


def _value(value: Any) -> str:
    """A TOML literal (a JSON string is a valid TOML basic string)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, datetime.date):
        return value.isoformat()
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(value)


def as_toml_table(price: InstancePrice) -> dict[str, Any]:
    """A price as its prices.toml table (`render` writes it back in the file's layout)."""
    table: dict[str, Any] = {
        "on_demand_usd_per_hour": price.on_demand_usd_per_hour,
        "spot_usd_per_hour": price.spot_usd_per_hour,
    }
    if price.capacity_block_usd_per_hour is not None:
        table["capacity_block_usd_per_hour"] = price.capacity_block_usd_per_hour
    table |= {
        "on_demand_upper_bound": price.on_demand_upper_bound,
        "on_demand_estimated": price.on_demand_estimated,
        "spot_estimated": price.spot_estimated,
        "checked": price.checked,
        "sources": {
            "on_demand": price.sources.on_demand,
            "spot": price.sources.spot,
            "capacity_block": price.sources.capacity_block,
        },
    }
    return table


def refresh(
    directory: Path, regions: Iterable[str], *, pricing: Any, ec2_for: Any, now: datetime.datetime
) -> str:
    """Rewrite prices.toml in `directory` with fresh figures for `regions`; what changed.

    `ec2_for(region)` gives an EC2 client for the region. The file is checked by loading it
    again; a bad result leaves the old file in place.
    """
    catalog = load_catalog(directory)
    path = directory / PRICES_FILE
    tables = {
        region: {t: as_toml_table(p) for t, p in prices.items()}
        for region, prices in catalog.prices.regions.items()
    }
    report = []
    for region in regions:
        on_demand = on_demand_prices(pricing, region, catalog.instances)
        if not on_demand:
            raise ConfigError(
                f"the AWS Price List offers none of the catalog's types in {region!r}: "
                "check the region name"
            )
        spot = spot_prices(ec2_for(region), on_demand, now)
        previous = catalog.prices.regions.get(region, {})
        tables[region] = refreshed_region(region, on_demand, spot, previous, now.date())
        missing = sorted(set(catalog.instances) - set(on_demand))
        report.append(
            f"{region}: {len(on_demand)} types priced"
            + (f"; not offered there: {', '.join(missing)}" if missing else "")
        )
    text = path.read_text()
    header = text[: text.index("[region.")] if "[region." in text else ""
    backup = text
    path.write_text(header + render(tables))
    try:
        load_catalog(directory)
    except ConfigError:
        path.write_text(backup)
        raise
    report += refresh_head_node(directory, regions, pricing=pricing, today=now.date())
    return "\n".join(report)


def refresh_head_node(
    directory: Path, regions: Iterable[str], *, pricing: Any, today: datetime.date
) -> list[str]:
    """Rewrite the head node's price per region in `directory`'s parallelcluster.toml."""
    path = directory / "parallelcluster.toml"
    if not path.exists():
        return []
    head_node = load_parallelcluster(path).head_node
    text = backup = path.read_text()
    report = []
    for region in regions:
        found = on_demand_prices(pricing, region, [head_node.instance_type])
        if head_node.instance_type not in found:
            report.append(f"{region}: the Price List offers no {head_node.instance_type}")
            continue
        price = found[head_node.instance_type]
        block = "\n".join(
            [
                f'[head_node.prices."{region}"]',
                f"on_demand_usd_per_hour = {_value(price)}",
                "on_demand_estimated = false",
                "source = "
                + _value(
                    f"AWS Price List API (pricing.get_products, regionCode {region}, Linux, "
                    f"shared tenancy): {head_node.instance_type} ${price}/h, read "
                    f"{today.isoformat()}"
                ),
                "",
            ]
        )
        existing = re.compile(
            rf'^\[head_node\.prices\."{re.escape(region)}"\]\n(?:[a-z_]+ = [^\n]*\n)*', re.M
        )
        if match := existing.search(text):
            text = text[: match.start()] + block + text[match.end() :]
        else:  # a new region: after the head node's last price table
            at = text.index("\n[release.")
            text = text[:at] + "\n" + block.rstrip("\n") + "\n" + text[at:]
        report.append(f"{region}: head node {head_node.instance_type} ${price}/h")
        text = re.sub(
            r"^prices_checked = .*$", f"prices_checked = {today}", text, count=1, flags=re.M
        )
    path.write_text(text)
    try:
        load_parallelcluster(path)
    except ConfigError:
        path.write_text(backup)
        raise
    return report
