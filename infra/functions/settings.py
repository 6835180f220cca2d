"""What the spend guard is told through its Lambda environment: one copy of that contract.

The Pulumi component writes it (`to_environment`), the handler reads it (`from_environment`).
Lambda caps a function's environment at 4 KB (Lambda quotas:
docs.aws.amazon.com/lambda/latest/dg/gettingstarted-limits.html), so prices go as compact JSON
for the stack's region only.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from infra.functions.market import PRICED_MARKETS

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
}
# Priced beside the instances: absent means the us-east-1 rates below.
_STORAGE_KEYS = {
    "ebs_usd_per_gb_month": "EBS_USD_PER_GB_MONTH",
    "public_ipv4_usd_per_hour": "PUBLIC_IPV4_USD_PER_HOUR",
}
# Amazon EBS pricing, us-east-1, per GB-month of provisioned size
# (https://aws.amazon.com/ebs/pricing/, read 2026-12-01).
EBS_USD_PER_GB_MONTH = {
    "gp3": 0.08,
    "gp2": 0.10,
    "io1": 0.125,
    "io2": 0.125,
    "st1": 0.045,
    "sc1": 0.015,
    "standard": 0.05,
}
# Every public IPv4 address, in use or not, since 2024-02-01
# (https://aws.amazon.com/blogs/aws/new-aws-public-ipv4-address-charge-public-ip-insights/).
PUBLIC_IPV4_USD_PER_HOUR = 0.005
# Set only for the stacks that have one: absent means none.
_OPTIONAL_KEYS = {
    "cluster_name": "CLUSTER_NAME",
    "capacity_block_id": "CAPACITY_BLOCK_ID",
}


class SettingsError(ValueError):
    """The function's environment is incomplete or malformed."""


@dataclass(frozen=True)
class GuardSettings:
    """`prices` maps instance type -> market (PRICED_MARKETS) -> $/h per instance, for
    `region`."""

    table: str
    topic_arn: str
    cost_tag: tuple[str, str]  # (key, value) every instance of the stack carries
    budget_usd: float
    budget_period: str
    thresholds_percent: tuple[float, ...]
    region: str
    prices: Mapping[str, Mapping[str, float]]
    # A Slurm cluster's ParallelCluster name: the guard stops its compute fleet the way
    # `pcluster update-compute-fleet --status STOP_REQUESTED` does.
    cluster_name: str = ""
    capacity_block_id: str = ""  # the Capacity Block the stack's nodes launch into
    # The stack's region's rates; a volume type missing here counts at the dearest one.
    ebs_usd_per_gb_month: Mapping[str, float] = field(
        default_factory=lambda: dict(EBS_USD_PER_GB_MONTH)
    )
    public_ipv4_usd_per_hour: float = PUBLIC_IPV4_USD_PER_HOUR

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

    def price(self, instance_type: str, market: str) -> float | None:
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
        }
        environment = {_KEYS[name]: value for name, value in values.items()}
        environment[_STORAGE_KEYS["ebs_usd_per_gb_month"]] = json.dumps(
            self.ebs_usd_per_gb_month, separators=(",", ":"), sort_keys=True
        )
        environment[_STORAGE_KEYS["public_ipv4_usd_per_hour"]] = repr(
            float(self.public_ipv4_usd_per_hour)
        )
        for name, key in _OPTIONAL_KEYS.items():
            if getattr(self, name):
                environment[key] = getattr(self, name)
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
            storage: dict[str, object] = {}
            if _STORAGE_KEYS["ebs_usd_per_gb_month"] in environ:
                storage["ebs_usd_per_gb_month"] = json.loads(
                    environ[_STORAGE_KEYS["ebs_usd_per_gb_month"]]
                )
            if _STORAGE_KEYS["public_ipv4_usd_per_hour"] in environ:
                storage["public_ipv4_usd_per_hour"] = float(
                    environ[_STORAGE_KEYS["public_ipv4_usd_per_hour"]]
                )
            return cls(
                table=raw["table"],
                topic_arn=raw["topic_arn"],
                cost_tag=(tag_key, tag_value),
                budget_usd=float(raw["budget_usd"]),
                budget_period=raw["budget_period"],
                thresholds_percent=thresholds,
                region=raw["region"],
                prices=json.loads(raw["prices"]),
                **{name: environ.get(key, "") for name, key in _OPTIONAL_KEYS.items()},
                **storage,
            )
        except (ValueError, TypeError, AttributeError) as exc:
            raise SettingsError(f"the function's environment is malformed: {exc}") from None
