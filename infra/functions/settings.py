"""What the spend guard is told through its Lambda environment: one copy of that contract.

The Pulumi component writes it (`to_environment`), the handler reads it (`from_environment`).
Lambda caps a function's environment at 4 KB (Lambda quotas:
docs.aws.amazon.com/lambda/latest/dg/gettingstarted-limits.html), so prices go as compact JSON
for the stack's region only.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from common.market import PRICED_MARKETS, Market

PERIODS = ("MONTHLY", "DAILY")

_KEYS = {
    "table": "LEDGER_TABLE",
    "topic_arn": "ALERT_TOPIC_ARN",
    "cost_tag": "COST_TAG",
    "budget_usd": "BUDGET_USD",
    "budget_period": "BUDGET_PERIOD",
    "thresholds_percent": "THRESHOLDS_PERCENT",
    "region": "PRICE_REGION",
    "prices": "PRICES_USD_PER_HOUR",
    "ebs_usd_per_gb_month": "EBS_USD_PER_GB_MONTH",
    "public_ipv4_usd_per_hour": "PUBLIC_IPV4_USD_PER_HOUR",
}
# Set only for the stacks that have one: absent means none.
_OPTIONAL_KEYS = {
    "cluster_name": "CLUSTER_NAME",
    "cluster_queue": "CLUSTER_QUEUE",
    "capacity_block_id": "CAPACITY_BLOCK_ID",
}
# Rates set only for the stacks that have what they price; absent means none (0.0).
_OPTIONAL_RATES = {"nat_gateway_usd_per_hour": "NAT_GATEWAY_USD_PER_HOUR"}


class SettingsError(ValueError):
    """The function's environment is incomplete or malformed."""


@dataclass(frozen=True)
class GuardSettings:
    """`prices` maps instance type -> market (PRICED_MARKETS) -> $/h per instance, for
    `region`; `ebs_usd_per_gb_month` (volume type -> $/GB-month) and `public_ipv4_usd_per_hour`
    are `region`'s rates too (infra/knowledge/data/volume_and_address_prices.toml)."""

    table: str
    topic_arn: str
    cost_tag: tuple[str, str]  # (key, value) every instance of the stack carries
    budget_usd: float
    budget_period: str
    thresholds_percent: tuple[float, ...]
    region: str
    prices: Mapping[str, Mapping[str, float]]
    ebs_usd_per_gb_month: Mapping[str, float]  # a volume type missing counts at the dearest
    public_ipv4_usd_per_hour: float
    # A Slurm cluster's ParallelCluster name: the guard stops its compute fleet the way
    # `pcluster update-compute-fleet --status STOP_REQUESTED` does.
    cluster_name: str = ""
    cluster_queue: str = ""  # its Slurm partition: the jobs the guard holds before the stop
    capacity_block_id: str = ""  # the Capacity Block the stack's nodes launch into
    # A cluster's NAT gateway, `region`'s rate (infra/knowledge/data/parallelcluster.toml);
    # 0.0: none given, and a NAT gateway found is unpriced.
    nat_gateway_usd_per_hour: float = 0.0

    def __post_init__(self) -> None:
        if self.budget_period not in PERIODS:
            raise SettingsError(f"budget period {self.budget_period!r} is not one of {PERIODS}")
        if not self.budget_usd > 0:
            raise SettingsError(f"budget {self.budget_usd!r} is not above 0 USD")
        for instance_type, by_market in self.prices.items():
            for market, price in by_market.items():
                if market not in PRICED_MARKETS or not price > 0:
                    raise SettingsError(f"price {instance_type} {market} = {price!r} is invalid")
        if not self.ebs_usd_per_gb_month or not all(
            rate > 0 for rate in self.ebs_usd_per_gb_month.values()
        ):
            raise SettingsError(f"EBS prices {dict(self.ebs_usd_per_gb_month)!r} are invalid")
        if not self.public_ipv4_usd_per_hour > 0:
            raise SettingsError(f"public IPv4 price {self.public_ipv4_usd_per_hour!r} is invalid")
        if not self.nat_gateway_usd_per_hour >= 0:
            raise SettingsError(f"NAT gateway price {self.nat_gateway_usd_per_hour!r} is invalid")

    def price(self, instance_type: str, market: Market) -> float | None:
        return self.prices.get(instance_type, {}).get(market)

    def to_environment(self) -> dict[str, str]:
        values = {
            "table": self.table,
            "topic_arn": self.topic_arn,
            "cost_tag": "=".join(self.cost_tag),
            "budget_usd": repr(float(self.budget_usd)),
            "budget_period": self.budget_period,
            "thresholds_percent": ",".join(f"{t:g}" for t in self.thresholds_percent),
            "region": self.region,
            "prices": json.dumps(self.prices, separators=(",", ":"), sort_keys=True),
            "ebs_usd_per_gb_month": json.dumps(
                self.ebs_usd_per_gb_month, separators=(",", ":"), sort_keys=True
            ),
            "public_ipv4_usd_per_hour": repr(float(self.public_ipv4_usd_per_hour)),
        }
        environment = {_KEYS[name]: value for name, value in values.items()}
        for name, key in _OPTIONAL_KEYS.items():
            if getattr(self, name):
                environment[key] = getattr(self, name)
        for name, key in _OPTIONAL_RATES.items():
            if getattr(self, name):
                environment[key] = repr(float(getattr(self, name)))
        return environment

    @classmethod
    def from_environment(cls, environ: Mapping[str, str]) -> GuardSettings:
        missing = [key for key in _KEYS.values() if key not in environ]
        if missing:
            raise SettingsError(f"the function's environment lacks {', '.join(missing)}")
        raw = {name: environ[key] for name, key in _KEYS.items()}
        tag_key, sep, tag_value = raw["cost_tag"].partition("=")
        if not sep or not tag_key or not tag_value:
            raise SettingsError(f"COST_TAG {raw['cost_tag']!r} is not KEY=VALUE")
        try:
            thresholds = tuple(float(t) for t in raw["thresholds_percent"].split(",") if t)
            return cls(
                table=raw["table"],
                topic_arn=raw["topic_arn"],
                cost_tag=(tag_key, tag_value),
                budget_usd=float(raw["budget_usd"]),
                budget_period=raw["budget_period"],
                thresholds_percent=thresholds,
                region=raw["region"],
                prices=json.loads(raw["prices"]),
                ebs_usd_per_gb_month=json.loads(raw["ebs_usd_per_gb_month"]),
                public_ipv4_usd_per_hour=float(raw["public_ipv4_usd_per_hour"]),
                **{name: environ.get(key, "") for name, key in _OPTIONAL_KEYS.items()},
                **{name: float(environ.get(key, 0.0)) for name, key in _OPTIONAL_RATES.items()},
            )
        except (ValueError, TypeError, AttributeError) as exc:
            raise SettingsError(f"the function's environment is malformed: {exc}") from None
