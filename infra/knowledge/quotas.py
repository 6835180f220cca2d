"""Which EC2 Service Quota an instance type launches under (data/quotas.toml)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from common.records import read_toml
from infra.errors import ConfigError

QUOTAS_PATH = Path(__file__).parent / "data" / "quotas.toml"


@dataclass(frozen=True)
class Quota:
    name: str
    code: str | None  # None: found by name


def quota_for(instance_type: str, *, spot: bool, path: Path = QUOTAS_PATH) -> Quota:
    """The vCPU quota `instance_type` counts against in its market (family = before the dot)."""
    family = instance_type.split(".", 1)[0]
    raw = read_toml(path, ConfigError)
    for group in raw.get("family", {}).values():
        if family in group["types"]:
            entry = group["spot" if spot else "on_demand"]
            return Quota(name=entry["name"], code=entry.get("code"))
    raise ConfigError(
        f"no EC2 quota recorded for the {family} family of {instance_type}: add it to "
        f"{path.name} (see the Service Quotas console, service ec2)"
    )
