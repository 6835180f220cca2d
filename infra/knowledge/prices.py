"""Prices per AWS region: infra/knowledge/data/prices.toml (instances) and
volume_and_address_prices.toml (EBS storage, public IPv4) loaded into checked, frozen records.

The stack's region (aws:region) picks its tables. A region or an instance type without a price
is refused in one sentence naming the regions that have prices: a stack is never priced with
another region's figures. `python -m infra prices --refresh` (infra/commands/prices.py) rewrites
the file from AWS's APIs (infra/knowledge/price_refresh.py).
"""

from __future__ import annotations

import dataclasses
import datetime
from dataclasses import field
from pathlib import Path
from typing import Annotated

from pydantic import Field, StrictBool, StrictFloat, model_validator

from common.market import Market
from common.records import DataFile, build_record, record
from infra.errors import ConfigError

PRICES_FILE = "prices.toml"
VOLUME_AND_ADDRESS_PRICES_FILE = "volume_and_address_prices.toml"  # beside PRICES_FILE
Usd = Annotated[StrictFloat, Field(gt=0)]
# AWS cut P4d/P4de on-demand prices by up to 33% and P5 by up to 45% from June 2025 (AWS
# What's New, 2025-06-05, "Announcing up to 45% price reduction for Amazon EC2 NVIDIA
# GPU-accelerated instances"): a figure taken before then may be half again too high.
PRICE_CUT = datetime.date(2025, 6, 1)
# How old a row may grow before tests/infra/knowledge/test_prices.py asks for a refresh.
MAX_PRICE_AGE_DAYS = 365


@record
class PriceSources:
    on_demand: str
    spot: str
    capacity_block: str | None = None


@record
class InstancePrice:
    """$/h of one instance of a type in one region, per market."""

    region: str
    instance_type: str
    on_demand_usd_per_hour: Usd
    spot_usd_per_hour: Usd
    on_demand_upper_bound: StrictBool  # figure predates the June 2025 P-family price cut
    on_demand_estimated: StrictBool  # not observed for this region: see sources.on_demand
    spot_estimated: StrictBool  # not observed for this region: see sources.spot
    checked: datetime.date
    sources: PriceSources
    capacity_block_usd_per_hour: Usd | None = None

    @model_validator(mode="after")
    def _plausible(self) -> InstancePrice:
        if self.checked < PRICE_CUT:
            raise ValueError(
                f"field 'checked': {self.checked} is before AWS's June 2025 GPU price cut "
                f"({PRICE_CUT}), so its figures may be far too high; take them again with "
                f"`python -m infra prices --refresh --region {self.region}`"
            )
        if self.spot_usd_per_hour > self.on_demand_usd_per_hour:
            raise ValueError(
                f"field 'spot_usd_per_hour': {self.spot_usd_per_hour} is above "
                f"on_demand_usd_per_hour {self.on_demand_usd_per_hour}; spot is never dearer"
            )
        return self

    @property
    def estimated(self) -> bool:
        return self.on_demand_estimated or self.spot_estimated

    def by_market(self) -> dict[Market, float]:
        """Market -> $/h per instance, for each market priced here."""
        markets = {
            Market.ON_DEMAND: self.on_demand_usd_per_hour,
            Market.SPOT: self.spot_usd_per_hour,
        }
        if self.capacity_block_usd_per_hour is not None:
            markets[Market.CAPACITY_BLOCK] = self.capacity_block_usd_per_hour
        return markets


@record
class VolumeAndAddressSources:
    ebs: str
    public_ipv4: str


@record
class VolumeAndAddressPrices:
    """What bills beside the instances' running time in one region."""

    region: str
    # EBS volume type (DescribeVolumes' VolumeType) -> $ per GB-month of provisioned size
    ebs_usd_per_gb_month: Annotated[dict[str, Usd], Field(min_length=1)] = field(hash=False)
    public_ipv4_usd_per_hour: Usd  # each public IPv4 address, in use or not
    ebs_estimated: StrictBool  # not observed for this region: see sources.ebs
    public_ipv4_estimated: StrictBool  # not observed for this region: see sources.public_ipv4
    checked: datetime.date
    sources: VolumeAndAddressSources


@dataclasses.dataclass(frozen=True)
class PriceTable:
    regions: dict[str, dict[str, InstancePrice]] = field(hash=False)  # region -> type -> price
    # region -> its EBS and public IPv4 rates
    volumes_and_addresses_by_region: dict[str, VolumeAndAddressPrices] = field(hash=False)

    def region(self, region: str) -> dict[str, InstancePrice]:
        try:
            return self.regions[region]
        except KeyError:
            raise ConfigError(
                f"the catalog has no prices for region {region!r} (regions with prices: "
                f"{', '.join(sorted(self.regions))}); deploy to one of those, or add "
                f"{region}'s prices to infra/knowledge/data/{PRICES_FILE} with "
                f"`python -m infra prices --refresh --region {region}`"
            ) from None

    def volumes_and_addresses(self, region: str) -> VolumeAndAddressPrices:
        """`region`'s EBS and public IPv4 rates, or a one-line ConfigError: a stack is never
        counted with another region's (a refresh may add a region's instance prices first)."""
        self.region(region)
        try:
            return self.volumes_and_addresses_by_region[region]
        except KeyError:
            raise ConfigError(
                f"the catalog has no EBS and public IPv4 rates for region {region!r} (regions "
                f"with them: {', '.join(sorted(self.volumes_and_addresses_by_region))}); add "
                f'[region."{region}"] with its rates from the Amazon EBS and VPC pricing pages '
                f"to infra/knowledge/data/{VOLUME_AND_ADDRESS_PRICES_FILE}"
            ) from None

    def price(self, region: str, instance_type: str) -> InstancePrice:
        prices = self.region(region)
        try:
            return prices[instance_type]
        except KeyError:
            elsewhere = sorted(r for r, table in self.regions.items() if instance_type in table)
            raise ConfigError(
                f"the catalog has no price for {instance_type} in {region} (AWS may not offer "
                f"it there; priced in {', '.join(elsewhere) or 'no region'}); pick another "
                f"instance type or region, or add its price to "
                f"infra/knowledge/data/{PRICES_FILE}"
            ) from None


def load_prices(path: Path, instance_types: set[str]) -> PriceTable:
    """Read and check prices.toml and, beside it, volume_and_address_prices.toml; every type
    priced must be a catalog instance type."""
    file = DataFile.read(path, {"region"}, ConfigError)
    regions: dict[str, dict[str, InstancePrice]] = {}
    for region, table in file.raw.get("region", {}).items():
        if not isinstance(table, dict):
            raise file.fail(f"region '{region}': expected a table of types")
        regions[region] = {}
        for instance_type, entry in table.items():
            where = f"{file.name}: region '{region}', type '{instance_type}'"
            if instance_type not in instance_types:
                raise ConfigError(
                    f"{where}: not an instance type of instances.toml "
                    f"(known: {', '.join(sorted(instance_types))})"
                )
            if not isinstance(entry, dict):
                raise ConfigError(f"{where}: expected a table, got {entry!r}")
            regions[region][instance_type] = build_record(
                InstancePrice,
                {"region": region, "instance_type": instance_type, **entry},
                where=where,
                error=ConfigError,
            )
    if not regions:
        raise file.fail('no [region."REGION"."TYPE"] tables')
    volumes_and_addresses = _load_volume_and_address_prices(
        path.with_name(VOLUME_AND_ADDRESS_PRICES_FILE)
    )
    return PriceTable(regions=regions, volumes_and_addresses_by_region=volumes_and_addresses)


def _load_volume_and_address_prices(path: Path) -> dict[str, VolumeAndAddressPrices]:
    file = DataFile.read(path, {"region"}, ConfigError)
    return file.tables(
        VolumeAndAddressPrices, "region", name_field="region", header='region."REGION"'
    )
