"""Shared by the infra tests: modified copies of the data files, the command line."""

import re
import shutil
import subprocess
import tomllib
from pathlib import Path
from types import SimpleNamespace

from infra.knowledge.catalog import CATALOG_DIR
from tests.support.preloaded import run_module


def modified_catalog(tmp_path: Path, file: str, old: str, new: str) -> Path:
    """A copy of the real catalog with the first `old` in `file` replaced by `new`."""
    for name in ("instances.toml", "amis.toml", "prices.toml", "volume_and_address_prices.toml"):
        shutil.copy(CATALOG_DIR / name, tmp_path / name)
    text = (tmp_path / file).read_text()
    assert old in text, f"test fixture out of date: {old!r} not in {file}"
    (tmp_path / file).write_text(text.replace(old, new, 1))
    return tmp_path


def run_cli(*args: str) -> subprocess.CompletedProcess:
    """`python -m infra ARGS` from the repository root (tests/support/preloaded.py)."""
    return run_module("infra", args)


def data_file_prices(instance_type: str, region: str = "us-east-1") -> SimpleNamespace:
    """One instance's $/h as prices.toml writes them (us-east-1: the mocks' region), read
    without the loader: tests of what the stack charges compute their expectation from the
    file, not from the code."""
    table = tomllib.loads((CATALOG_DIR / "prices.toml").read_text())["region"][region]
    entry = table[instance_type]
    return SimpleNamespace(
        on_demand_usd_per_hour=entry["on_demand_usd_per_hour"],
        spot_usd_per_hour=entry["spot_usd_per_hour"],
        capacity_block_usd_per_hour=entry.get("capacity_block_usd_per_hour"),
    )


def data_file_head_node(region: str = "us-east-1") -> SimpleNamespace:
    """The Slurm head node's type and on-demand $/h in `region` as parallelcluster.toml writes
    them, read without the loader (as data_file_prices)."""
    head_node = tomllib.loads((CATALOG_DIR / "parallelcluster.toml").read_text())["head_node"]
    return SimpleNamespace(
        instance_type=head_node["instance_type"],
        on_demand_usd_per_hour=head_node["prices"][region]["on_demand_usd_per_hour"],
    )


def data_file_cluster_idle_usd_per_hour(region: str = "us-east-1") -> float:
    """A Slurm cluster's $/h with no job in `region`: the head node and the NAT gateway, as
    parallelcluster.toml writes them, and the gateway's public address, as
    volume_and_address_prices.toml does (read without the loaders)."""
    network = tomllib.loads((CATALOG_DIR / "parallelcluster.toml").read_text())["network"]
    rates = tomllib.loads((CATALOG_DIR / "volume_and_address_prices.toml").read_text())["region"]
    return (
        data_file_head_node(region).on_demand_usd_per_hour
        + network["prices"][region]["nat_gateway_usd_per_hour"]
        + rates[region]["public_ipv4_usd_per_hour"]
    )


def parallelcluster_without_head_node_price(tmp_path: Path, region: str) -> Path:
    """A copy of parallelcluster.toml without the head node's price table for `region`."""
    text, removed = re.subn(
        rf'\[head_node\.prices\."{re.escape(region)}"\]\n(.+\n)+',
        "",
        (CATALOG_DIR / "parallelcluster.toml").read_text(),
    )
    assert removed == 1, f"test fixture out of date: no head-node price for {region}"
    path = tmp_path / "parallelcluster.toml"
    path.write_text(text)
    return path
