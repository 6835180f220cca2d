"""Named stack profiles (data/profiles.toml): a workload mapped to an instance and variant."""

from __future__ import annotations

import dataclasses
import datetime
from dataclasses import field
from pathlib import Path
from typing import Annotated

from pydantic import Field, StrictFloat, StrictInt, field_validator

from common.records import DataFile, record
from images.matrix import Matrix
from infra.errors import ConfigError
from infra.knowledge.catalog import Catalog
from infra.knowledge.resolver import AUTO, DEFAULT_PLAN_REGION, Plan, resolve

PROFILES_PATH = Path(__file__).parent / "data" / "profiles.toml"


@record
class ExchangeRate:
    cny_per_usd: Annotated[StrictFloat, Field(gt=0)]
    as_of: datetime.date
    source: str

    def to_cny(self, usd: float) -> float:
        return usd * self.cny_per_usd


@record
class Profile:
    """A named workload: where it runs and why that instance was chosen."""

    name: str
    description: str
    instance_type: str
    mapping: str  # why this instance answers the workload, and the trade-off
    variant: str = AUTO
    nodes: Annotated[StrictInt, Field(ge=1)] = 1
    guide_row: str | None = None  # the selection guide's row it answers: workload and hardware
    guide_cny_per_hour: tuple[StrictFloat, StrictFloat] | None = None  # that row's price range
    guide_hardware_gone: str | None = None  # why the row's own hardware cannot be rented

    @field_validator("guide_cny_per_hour")
    @classmethod
    def _ordered_range(cls, value: tuple[float, float] | None) -> tuple[float, float] | None:
        if value is not None and not 0 < value[0] <= value[1]:
            raise ValueError("must be [low, high] with 0 < low <= high")
        return value


@dataclasses.dataclass(frozen=True)
class Profiles:
    default: str
    exchange_rate: ExchangeRate
    profiles: dict[str, Profile] = field(hash=False)

    def get(self, name: str) -> Profile:
        try:
            return self.profiles[name]
        except KeyError:
            raise ConfigError(
                f"unknown profile {name!r}: known profiles are {', '.join(self.profiles)}"
            ) from None


def load_profiles(path: Path | str | None = None) -> Profiles:
    """Load and check data/profiles.toml (or `path`); raise ConfigError in one line."""
    path = Path(path) if path is not None else PROFILES_PATH
    file = DataFile.read(path, {"default", "exchange_rate", "profile"}, ConfigError)
    rate = file.table(ExchangeRate, "exchange_rate")
    profiles = file.tables(Profile, "profile", name_field="name")
    default = file.raw.get("default")
    if default not in profiles:
        raise file.fail(
            f"key 'default' is {default!r}, not one of the profiles "
            f"({', '.join(profiles) or 'none defined'})"
        )
    return Profiles(default=default, exchange_rate=rate, profiles=profiles)


def resolve_profile(
    name: str | None = None,
    *,
    profiles: Profiles | None = None,
    catalog: Catalog | None = None,
    matrix: Matrix | None = None,
    today: datetime.date | None = None,
    region: str = DEFAULT_PLAN_REGION,
) -> Plan:
    """Resolve a named profile (default: the file's default) to a Plan priced for `region`.

    Adds a warning when the AWS price falls outside the CNY range a GPU-cloud selection guide
    quotes for the workload.
    """
    profiles = profiles if profiles is not None else load_profiles()
    profile = profiles.get(name if name is not None else profiles.default)
    plan = resolve(
        profile.instance_type,
        profile.variant,
        profile.nodes,
        catalog=catalog,
        matrix=matrix,
        today=today,
        region=region,
    )
    comparison = guide_price_warning(profile, plan, profiles.exchange_rate)
    if comparison is None:
        return plan
    return dataclasses.replace(plan, warnings=(*plan.warnings, comparison))


def guide_price_warning(profile: Profile, plan: Plan, rate: ExchangeRate) -> str | None:
    """A sentence when the on-demand price is outside the selection guide's range, else None."""
    if profile.guide_cny_per_hour is None:
        return None
    low, high = profile.guide_cny_per_hour
    on_demand = rate.to_cny(plan.on_demand_usd_per_hour)
    spot = rate.to_cny(plan.spot_usd_per_hour)
    if low <= on_demand <= high:
        return None
    side = "above" if on_demand > high else "below"
    return (
        f"on-demand {on_demand:.0f} CNY/h is {side} the selection guide's {low:g}-{high:g} CNY/h "
        f"(spot {spot:.0f} CNY/h; at {rate.cny_per_usd} CNY/USD of {rate.as_of.isoformat()})"
    )
