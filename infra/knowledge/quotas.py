"""Which EC2 vCPU quota a plan needs, and how much of it (data/quotas.toml). Pure."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field

from common.market import Market
from common.records import DataFile, record
from infra.errors import ConfigError
from infra.knowledge.resolver import Plan

QUOTAS_PATH = Path(__file__).parent / "data" / "quotas.toml"
_FAMILY = re.compile(r"^([a-z]+\d)")


@record
class Quota:
    """One EC2 Service Quota on running vCPUs: the families and the market it caps."""

    market: Literal["on-demand", "spot"]
    families: Annotated[tuple[str, ...], Field(min_length=1)]
    names: Annotated[tuple[str, ...], Field(min_length=1)]  # newest first
    source: str
    code: str | None = None  # None: look the quota up by name


@dataclass(frozen=True)
class QuotaNeed:
    """The quota that caps this plan's instances, and the vCPUs the plan needs of it."""

    names: tuple[str, ...]  # the quota's name, newest first
    code: str | None  # None: look the quota up by name
    vcpus: int
    instance_type: str
    nodes: int
    market: Market

    @property
    def name(self) -> str:
        return self.names[0]


def instance_family(instance_type: str) -> str:
    """ "p4d.24xlarge" -> "p4", "gr6.4xlarge" -> "gr6", "g6e.xlarge" -> "g6"."""
    match = _FAMILY.match(instance_type)
    if match is None:
        raise ConfigError(f"instance type {instance_type!r} has no family letter and generation")
    return match[1]


def quota_need(plan: Plan, market: Market, path: Path | None = None) -> QuotaNeed | None:
    """The quota `plan`'s nodes count against in `market` (quotas.toml names on-demand and
    spot), or None."""
    family = instance_family(plan.instance.type)
    quotas = DataFile.read(path or QUOTAS_PATH, {"quota"}, ConfigError).tables(Quota, "quota")
    for quota in quotas.values():
        if quota.market == market and family in quota.families:
            return QuotaNeed(
                names=quota.names,
                code=quota.code,
                vcpus=plan.instance.vcpus * plan.nodes,
                instance_type=plan.instance.type,
                nodes=plan.nodes,
                market=market,
            )
    return None
