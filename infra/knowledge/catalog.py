"""The instance and AMI catalog: infra/knowledge/data/*.toml loaded into checked, frozen records.

Facts live in the TOML files next to this module (with dates and sources), prices per region
in prices.toml (infra/knowledge/prices.py); this module only reads and checks them.
"""

from __future__ import annotations

import dataclasses
import datetime
import re
from dataclasses import field
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, StrictInt, field_validator
from pydantic.dataclasses import dataclass

from common.records import (
    RECORD_CONFIG,
    build_record,
    check_keys,
    read_toml,
)
from common.versions import dotted_version, version_key
from images.matrix import check_capability
from infra.errors import ConfigError
from infra.knowledge.prices import PRICES_FILE, PriceTable, load_prices

CATALOG_DIR = Path(__file__).parent / "data"
_ROOT_DEVICE_NAME = re.compile(r"/dev/(sd[a-z][0-9]*|xvd[a-z])")


@dataclass(frozen=True, config=RECORD_CONFIG)
class InstanceSources:
    hardware: str


@dataclass(frozen=True, config=RECORD_CONFIG)
class Instance:
    """One EC2 GPU instance type (its prices per region are in prices.toml)."""

    type: str
    gpu_model: str
    gpu_count: Annotated[StrictInt, Field(ge=1)]
    gpu_memory_gib: Annotated[StrictInt, Field(gt=0)]  # per GPU
    gpu_interconnect: Literal["none", "PCIe", "NVLink", "NVSwitch"]
    compute_capability: str
    vcpus: Annotated[StrictInt, Field(gt=0)]
    memory_gib: Annotated[StrictInt, Field(gt=0)]
    efa_interfaces: Annotated[StrictInt, Field(ge=0)]
    network_cards: Annotated[StrictInt, Field(ge=1)]
    instance_store_nvme: Annotated[StrictInt, Field(ge=0)]  # drives
    instance_store_gb: Annotated[StrictInt, Field(ge=0)]  # all drives together
    sources: InstanceSources
    # The kind of EFA interface on network cards 1..n in a multi-node layout; the primary
    # (card 0) is always "efa", since an EFA-only interface carries no IP traffic.
    efa_secondary_interface: Literal["efa", "efa-only"] = "efa"

    @field_validator("compute_capability")
    @classmethod
    def _capability(cls, value: str) -> str:
        return check_capability(value)

    @property
    def total_gpu_memory_gib(self) -> int:
        return self.gpu_count * self.gpu_memory_gib


@dataclass(frozen=True, config=RECORD_CONFIG)
class AmiSources:
    ssm_parameter: str
    driver_version: str
    compute_capabilities: str
    end_of_life: str
    root_device_name: str
    no_longer_supports: str | None = None


@dataclass(frozen=True, config=RECORD_CONFIG)
class AmiFamily:
    """An AMI family, found at deploy time through its public SSM parameter."""

    name: str
    description: str
    ssm_parameter: str
    os: str
    # The AMI's RootDeviceName: a block device mapping under another name would add a
    # second volume instead of resizing the root one.
    root_device_name: str
    driver_kind: Literal["open", "proprietary"]
    driver_branch: str
    driver_version: str
    compute_capabilities: tuple[str, ...]
    end_of_life: datetime.date
    checked: datetime.date
    sources: AmiSources
    # Instance families (e.g. "p3") that the family's latest release no longer lists as
    # supported: the last release that did still boots them, unsupported.
    no_longer_supports: tuple[str, ...] = ()

    _check_driver = field_validator("driver_version")(dotted_version)

    @field_validator("ssm_parameter")
    @classmethod
    def _public_parameter(cls, value: str) -> str:
        if not value.startswith("/aws/service/") or " " in value:
            raise ValueError("must be a public SSM parameter path starting with /aws/service/")
        return value

    @field_validator("root_device_name")
    @classmethod
    def _device_name(cls, value: str) -> str:
        if not _ROOT_DEVICE_NAME.fullmatch(value):
            raise ValueError("must be an EC2 root device name such as /dev/xvda or /dev/sda1")
        return value

    @field_validator("compute_capabilities")
    @classmethod
    def _capabilities(cls, values: tuple[str, ...]) -> tuple[str, ...]:
        if not values:
            raise ValueError("list at least one compute capability")
        return tuple(check_capability(value) for value in values)

    def supports(self, capability: str) -> bool:
        """The driver supports this GPU architecture (exact match: drivers list GPUs)."""
        return capability in self.compute_capabilities

    def runs_driver(self, minimum: str) -> bool:
        return version_key(self.driver_version) >= version_key(minimum)

    def past_end_of_life(self, today: datetime.date) -> bool:
        return today > self.end_of_life


@dataclasses.dataclass(frozen=True)
class Catalog:
    instances: dict[str, Instance] = field(hash=False)
    amis: tuple[AmiFamily, ...]  # in order of preference
    prices: PriceTable

    def instance(self, instance_type: str) -> Instance:
        try:
            return self.instances[instance_type]
        except KeyError:
            known = ", ".join(self.instances)
            raise ConfigError(
                f"unknown instance type {instance_type!r}: the catalog has {known} "
                "(add it to infra/knowledge/data/instances.toml, see docs/catalog.md)"
            ) from None


def load_catalog(directory: Path | str | None = None) -> Catalog:
    """Load instances.toml, amis.toml and prices.toml from `directory` (default: this package)."""
    directory = Path(directory) if directory is not None else CATALOG_DIR
    instances = _load_instances(directory / "instances.toml")
    return Catalog(
        instances=instances,
        amis=_load_amis(directory / "amis.toml"),
        prices=load_prices(directory / PRICES_FILE, set(instances)),
    )


def _load_instances(path: Path) -> dict[str, Instance]:
    raw = read_toml(path, ConfigError)
    check_keys(raw, {"instance"}, where=path.name, error=ConfigError)
    instances: dict[str, Instance] = {}
    for name, table in raw.get("instance", {}).items():
        where = f"{path.name}: instance '{name}'"
        entry = build_record(
            Instance, _named(table, "type", name, where), where=where, error=ConfigError
        )
        if entry.efa_interfaces > entry.network_cards:
            raise ConfigError(
                f"{where}, field 'efa_interfaces': {entry.efa_interfaces} is more than "
                f"network_cards {entry.network_cards} (one EFA interface per network card)"
            )
        if entry.efa_secondary_interface == "efa-only" and entry.efa_interfaces < 2:
            raise ConfigError(
                f"{where}, field 'efa_secondary_interface': 'efa-only' needs at least 2 EFA "
                f"interfaces (the primary is always 'efa'), efa_interfaces is "
                f"{entry.efa_interfaces}; use 'efa' or leave it out"
            )
        instances[name] = entry
    if not instances:
        raise ConfigError(f'{path.name}: no [instance."TYPE"] tables')
    return instances


def _load_amis(path: Path) -> tuple[AmiFamily, ...]:
    raw = read_toml(path, ConfigError)
    check_keys(raw, {"ami"}, where=path.name, error=ConfigError)
    amis = []
    for name, table in raw.get("ami", {}).items():
        where = f"{path.name}: ami '{name}'"
        table = _named(table, "name", name, where)
        amis.append(build_record(AmiFamily, table, where=where, error=ConfigError))
    if not amis:
        raise ConfigError(f"{path.name}: no [ami.NAME] tables")
    return tuple(amis)


def _named(table: object, key: str, name: str, where: str) -> dict:
    """The table with its name (the TOML table key) added as field `key`."""
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: expected a table, got {type(table).__name__} {table!r}")
    if key in table:
        raise ConfigError(f"{where}, field '{key}': set by the table name, remove it")
    return {key: name, **table}
