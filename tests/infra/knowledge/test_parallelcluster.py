"""ParallelCluster releases as data, the head node's price per region, and the resolver's
driver check for a Slurm cluster."""

import tomllib

import pytest

from images.matrix import load_matrix
from infra.errors import ConfigError
from infra.knowledge.catalog import CATALOG_DIR
from infra.knowledge.parallelcluster import PARALLELCLUSTER_PATH, load_parallelcluster
from infra.knowledge.resolver import resolve
from tests.support.infra import parallelcluster_without_head_node_price

PARALLELCLUSTER = load_parallelcluster()
PARALLELCLUSTER_TEXT = PARALLELCLUSTER_PATH.read_text()
MATRIX = load_matrix()


def test_each_release_records_its_amis_driver_with_a_source():
    # The figures the releases' notes give (aws/aws-parallelcluster PR #7010 for 3.14;
    # awslabs/awsome-distributed-ai PR #1211 for 3.15).
    drivers = {v: r.driver_version for v, r in PARALLELCLUSTER.releases.items()}
    assert drivers == {"3.14.0": "570.172.08", "3.15.1": "580.126.20"}
    for release in PARALLELCLUSTER.releases.values():
        assert "PR #" in release.sources.driver_version
    assert PARALLELCLUSTER.release().version == PARALLELCLUSTER.default


def test_an_unknown_release_names_the_known_ones():
    with pytest.raises(ConfigError, match=r"'3\.9\.0' is not in .*use one of 3\.14\.0, 3\.15\.1"):
        PARALLELCLUSTER.release("3.9.0")


def test_a_variant_the_releases_driver_cannot_run_is_refused_with_reason_and_fix():
    cu130 = MATRIX.variant("cu130")
    assert cu130.min_driver == "580.65.06"  # CUDA 13.0's toolkit driver, above 570.172.08
    with pytest.raises(ConfigError) as caught:
        resolve("p4d.24xlarge", "cu130", nodes=2, cluster=PARALLELCLUSTER.release("3.14.0"))
    message = str(caught.value)
    assert "\n" not in message
    for part in (
        "'cu130'",
        "580.65.06",
        "3.14.0",
        "570.172.08",
        "'cu128'",
        "parallelClusterVersion",
    ):
        assert part in message


def test_the_same_variant_runs_on_the_newer_release():
    plan = resolve("p4d.24xlarge", "cu130", nodes=2, cluster=PARALLELCLUSTER.release("3.15.1"))
    assert plan.variant.name == "cu130"
    assert plan.cluster.version == "3.15.1"


def test_auto_picks_the_newest_variant_the_clusters_driver_runs():
    on_314 = resolve("p4d.24xlarge", nodes=2, cluster=PARALLELCLUSTER.release("3.14.0"))
    on_315 = resolve("p4d.24xlarge", nodes=2, cluster=PARALLELCLUSTER.release("3.15.1"))
    assert (on_314.variant.name, on_315.variant.name) == ("cu128", "cu130")
    # The EC2 path's DLAMI carries a 595 driver: it runs cu130 whatever the cluster says.
    assert resolve("p4d.24xlarge", nodes=2).variant.name == "cu130"


def test_a_broken_release_entry_is_one_line(tmp_path):
    text = PARALLELCLUSTER_TEXT.replace('driver_version = "570.172.08"', 'driver_version = "570.x"')
    (tmp_path / "parallelcluster.toml").write_text(text)
    with pytest.raises(ConfigError, match=r"release '3\.14\.0', field 'driver_version'"):
        load_parallelcluster(tmp_path / "parallelcluster.toml")


def test_the_head_node_is_priced_in_every_region_with_instance_prices():
    head_node = tomllib.loads(PARALLELCLUSTER_TEXT)["head_node"]["prices"]
    regions = tomllib.loads((CATALOG_DIR / "prices.toml").read_text())["region"]
    assert set(head_node) == set(regions)
    for region, entry in head_node.items():
        price = PARALLELCLUSTER.head_node.price_in(region)
        assert price.on_demand_usd_per_hour == entry["on_demand_usd_per_hour"]
        # An estimate says so, and says how it was made, as prices.toml's do.
        assert price.on_demand_estimated == price.source.startswith("estimate: ")
    assert not PARALLELCLUSTER.head_node.price_in("us-east-1").on_demand_estimated


def test_a_region_without_a_head_node_price_is_one_sentence_naming_the_file(tmp_path):
    path = parallelcluster_without_head_node_price(tmp_path, "eu-west-1")
    head_node = load_parallelcluster(path).head_node
    with pytest.raises(ConfigError) as caught:
        head_node.price_in("eu-west-1")
    message = str(caught.value)
    assert "\n" not in message
    assert "region 'eu-west-1'" in message and "regions with one: us-east-1, us-west-2" in message
    assert 'infra/knowledge/data/parallelcluster.toml as [head_node.prices."eu-west-1"]' in message


def test_a_broken_head_node_price_is_one_line(tmp_path):
    text = PARALLELCLUSTER_TEXT.replace(
        "on_demand_usd_per_hour = 0.107", "on_demand_usd_per_hour = 0"
    )
    assert text != PARALLELCLUSTER_TEXT
    (tmp_path / "parallelcluster.toml").write_text(text)
    with pytest.raises(
        ConfigError, match=r"field 'prices\.eu-west-1\.on_demand_usd_per_hour' is 0"
    ):
        load_parallelcluster(tmp_path / "parallelcluster.toml")


def test_the_clusters_network_is_priced_in_every_region_the_head_node_is():
    network = tomllib.loads(PARALLELCLUSTER_TEXT)["network"]["prices"]
    assert set(network) == set(tomllib.loads(PARALLELCLUSTER_TEXT)["head_node"]["prices"])
    for region in network:
        price = PARALLELCLUSTER.network.price_in(region)
        assert price.estimated == price.source.startswith("estimate: ")
        assert "https://aws.amazon.com/vpc/pricing/" in price.source
    # Amazon VPC pricing, us-east-1: NAT gateway $0.045/h, public IPv4 $0.005/h; m5.large
    # $0.096/h.
    assert PARALLELCLUSTER.network_usd_per_hour("us-east-1") == pytest.approx(0.05)
    assert PARALLELCLUSTER.idle_usd_per_hour("us-east-1") == pytest.approx(0.146)
    assert not PARALLELCLUSTER.network.price_in("us-east-1").estimated


def test_a_region_without_a_network_price_is_one_sentence_naming_the_table():
    with pytest.raises(ConfigError) as caught:
        PARALLELCLUSTER.network.price_in("eu-west-3")
    message = str(caught.value)
    assert "\n" not in message and "NAT gateway price for region 'eu-west-3'" in message
    assert '[network.prices."eu-west-3"]' in message
