"""The instance and AMI catalog: infra/knowledge/data/*.toml loaded into checked, frozen records.

Facts live in the TOML files next to this module (with dates and sources), prices per region
in prices.toml (infra/knowledge/prices.py); this module only reads and checks them.
"""

from __future__ import annotations

import dataclasses
import datetime
from dataclasses import field
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, StrictInt, field_validator, model_validator

from common.records import DataFile, matching, record
from common.versions import dotted_version, version_key
from images.matrix import check_capability
from infra.errors import ConfigError
from infra.knowledge.prices import PRICES_FILE, PriceTable, load_prices

CATALOG_DIR = Path(__file__).parent / "data"


@record
class InstanceSources:
    hardware: str


@record
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

    @model_validator(mode="after")
    def _efa_fits_the_network_cards(self) -> Instance:
        if self.efa_interfaces > self.network_cards:
            raise ValueError(
                f"field 'efa_interfaces': {self.efa_interfaces} is more than network_cards "
                f"{self.network_cards} (one EFA interface per network card)"
            )
        if self.efa_secondary_interface == "efa-only" and self.efa_interfaces < 2:
            raise ValueError(
                "field 'efa_secondary_interface': 'efa-only' needs at least 2 EFA interfaces "
                f"(the primary is always 'efa'), efa_interfaces is {self.efa_interfaces}; "
                "use 'efa' or leave it out"
            )
        return self

    @property
    def total_gpu_memory_gib(self) -> int:
        return self.gpu_count * self.gpu_memory_gib


@record
class AmiSources:
    ssm_parameter: str
    driver_version: str
    compute_capabilities: str
    end_of_life: str
    root_device_name: str
    no_longer_supports: str | None = None


@record
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

    _public_parameter = field_validator("ssm_parameter")(
        matching(
            r"/aws/service/\S*", "must be a public SSM parameter path starting with /aws/service/"
        )
    )
    _device_name = field_validator("root_device_name")(
        matching(
            r"/dev/(sd[a-z][0-9]*|xvd[a-z])",
            "must be an EC2 root device name such as /dev/xvda or /dev/sda1",
        )
    )

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
    file = DataFile.read(path, {"instance"}, ConfigError)
    return file.tables(Instance, "instance", name_field="type", header='instance."TYPE"')


def _load_amis(path: Path) -> tuple[AmiFamily, ...]:
    file = DataFile.read(path, {"ami"}, ConfigError)
    return tuple(file.tables(AmiFamily, "ami", name_field="name", header="ami.NAME").values())
