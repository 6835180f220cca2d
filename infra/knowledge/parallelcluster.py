"""AWS ParallelCluster releases (data/parallelcluster.toml): their AMIs' driver, the head node
and its price per region, the cluster network's price per region.

Facts live in the TOML file next to this package's catalog (with dates and
sources); this module only reads and checks them.
"""

from __future__ import annotations

import dataclasses
import datetime
from dataclasses import field
from pathlib import Path
from typing import Annotated

from pydantic import Field, StrictBool, field_validator

from common.records import DataFile, record
from common.versions import dotted_version, version_key
from infra.errors import ConfigError
from infra.knowledge.catalog import CATALOG_DIR, load_catalog
from infra.knowledge.prices import Usd

PARALLELCLUSTER_PATH = CATALOG_DIR / "parallelcluster.toml"


@record
class ReleaseSources:
    driver_version: str


@record
class Release:
    """One ParallelCluster release, as its official AMIs ship it."""

    version: str
    driver_version: str
    cuda: str
    checked: datetime.date
    sources: ReleaseSources

    _check_versions = field_validator("version", "driver_version", "cuda")(dotted_version)

    def runs_driver(self, minimum: str) -> bool:
        """The AMIs' driver is at least `minimum` (as AmiFamily.runs_driver compares)."""
        return version_key(self.driver_version) >= version_key(minimum)


@record
class HeadNodePrice:
    """$/h of the head node in one region (on demand only: the head node is never spot)."""

    on_demand_usd_per_hour: Usd
    on_demand_estimated: StrictBool  # not observed for this region: see source
    source: str


@record
class HeadNode:
    instance_type: str
    prices_checked: datetime.date
    prices: Annotated[dict[str, HeadNodePrice], Field(min_length=1)] = field(hash=False)

    def price_in(self, region: str) -> HeadNodePrice:
        """The head node's price in `region`, or a one-line ConfigError: a cluster is never
        priced with another region's figure (as PriceTable.region refuses)."""
        try:
            return self.prices[region]
        except KeyError:
            raise ConfigError(
                f"the catalog has no head-node price for region {region!r} (regions with one: "
                f"{', '.join(sorted(self.prices))}); deploy the Slurm cluster to one of those, "
                f"or add {region}'s {self.instance_type} on-demand price to "
                f'infra/knowledge/data/parallelcluster.toml as [head_node.prices."{region}"]'
            ) from None


@record
class NetworkPrice:
    """$/h of the cluster's NAT gateway in one region (its public IPv4 address bills at the
    region's rate, infra/knowledge/data/volume_and_address_prices.toml)."""

    nat_gateway_usd_per_hour: Usd
    estimated: StrictBool  # not observed for this region: see source
    source: str


@record
class ClusterNetwork:
    prices_checked: datetime.date
    prices: Annotated[dict[str, NetworkPrice], Field(min_length=1)] = field(hash=False)

    def price_in(self, region: str) -> NetworkPrice:
        """The network's price in `region`, or a one-line ConfigError (as HeadNode.price_in)."""
        try:
            return self.prices[region]
        except KeyError:
            raise ConfigError(
                f"the catalog has no NAT gateway price for region {region!r} (regions with one: "
                f"{', '.join(sorted(self.prices))}); deploy the Slurm cluster to one of those, "
                "or add its price to infra/knowledge/data/parallelcluster.toml as "
                f'[network.prices."{region}"]'
            ) from None


@dataclasses.dataclass(frozen=True)
class ParallelCluster:
    default: str
    head_node: HeadNode
    network: ClusterNetwork
    releases: dict[str, Release] = field(hash=False)  # oldest first

    def network_usd_per_hour(self, region: str) -> float:
        """The cluster's route out in `region`: its NAT gateway and the gateway's address."""
        return (
            self.network.price_in(region).nat_gateway_usd_per_hour
            + load_catalog().prices.volumes_and_addresses(region).public_ipv4_usd_per_hour
        )

    def idle_usd_per_hour(self, region: str) -> float:
        """What the cluster costs in `region` with no job: the head node and its route out."""
        return self.head_node.price_in(region).on_demand_usd_per_hour + self.network_usd_per_hour(
            region
        )

    def release(self, version: str | None = None) -> Release:
        """The named release (default: the file's `default`), or a one-line ConfigError."""
        version = version or self.default
        try:
            return self.releases[version]
        except KeyError:
            known = ", ".join(self.releases)
            raise ConfigError(
                f"ParallelCluster {version!r} is not in infra/knowledge/data/parallelcluster.toml: "
                f"use one of {known} (or add the release with its AMIs' NVIDIA driver)"
            ) from None


def load_parallelcluster(path: Path | str | None = None) -> ParallelCluster:
    path = Path(path) if path is not None else PARALLELCLUSTER_PATH
    file = DataFile.read(path, {"default", "head_node", "network", "release"}, ConfigError)
    releases = file.tables(Release, "release", name_field="version", header='release."X.Y.Z"')
    cluster = ParallelCluster(
        default=file.raw.get("default", ""),
        head_node=file.table(HeadNode, "head_node"),
        network=file.table(ClusterNetwork, "network"),
        releases=dict(sorted(releases.items(), key=lambda item: version_key(item[0]))),
    )
    cluster.release()  # the default must be one of them
    return cluster
