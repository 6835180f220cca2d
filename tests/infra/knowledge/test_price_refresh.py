"""The price refresh: EC2's spot price history from moto's server; the Price List API from
recorded responses (moto does not implement the Pricing service), replayed through botocore's
Stubber, which checks them against the service's own model."""

from __future__ import annotations

import datetime
import json
import shutil

import boto3
import pytest
from botocore.stub import Stubber

from infra.knowledge.catalog import CATALOG_DIR, load_catalog
from infra.knowledge.parallelcluster import load_parallelcluster
from infra.knowledge.price_refresh import (
    PRICE_LIST_REGION,
    as_toml_table,
    refresh,
    render,
)
from tests.support.aws import FAKE_CREDENTIALS, client, reset

NOW = datetime.datetime(2026, 12, 1, 12, 0, tzinfo=datetime.UTC)


def price_list_entry(instance_type: str, region: str, usd: str) -> str:
    """One PriceList element as the Price List API returns it (a JSON document as a string)."""
    return json.dumps(
        {
            "product": {
                "productFamily": "Compute Instance",
                "attributes": {
                    "instanceType": instance_type,
                    "regionCode": region,
                    "operatingSystem": "Linux",
                    "tenancy": "Shared",
                },
                "sku": "JRTCKXETXF7TU4YD",
            },
            "serviceCode": "AmazonEC2",
            "terms": {
                "OnDemand": {
                    "JRTCKXETXF7TU4YD.JRTCKXETXF": {
                        "priceDimensions": {
                            "JRTCKXETXF7TU4YD.JRTCKXETXF.6YS6EN2CT7": {
                                "unit": "Hrs",
                                "pricePerUnit": {"USD": usd},
                                "description": f"${usd} per On Demand Linux {instance_type}",
                            }
                        },
                        "effectiveDate": "2026-11-01T00:00:00Z",
                    }
                }
            },
            "publicationDate": "2026-11-28T00:00:00Z",
        }
    )


@pytest.fixture
def catalog_copy(tmp_path):
    for name in ("instances.toml", "amis.toml", "prices.toml", "volume_and_address_prices.toml"):
        shutil.copy(CATALOG_DIR / name, tmp_path / name)
    return tmp_path


def test_the_file_renders_back_to_the_same_prices(catalog_copy):
    before = load_catalog(catalog_copy).prices
    path = catalog_copy / "prices.toml"
    tables = {r: {t: as_toml_table(p) for t, p in ps.items()} for r, ps in before.regions.items()}
    path.write_text(render(tables))
    assert load_catalog(catalog_copy).prices == before


def test_refresh_rewrites_one_region_from_the_price_list_and_the_spot_history(
    catalog_copy, moto_endpoint
):
    offered = {"p4d.24xlarge": "24.1500000000", "g5.xlarge": "1.1230000000"}
    pricing = boto3.client("pricing", region_name=PRICE_LIST_REGION, **FAKE_CREDENTIALS)
    before = load_catalog(catalog_copy)
    reset(moto_endpoint)
    with Stubber(pricing) as stub:
        for instance_type in before.instances:  # one query per catalog type, in catalog order
            usd = offered.get(instance_type)
            entries = [price_list_entry(instance_type, "eu-west-1", usd)] if usd else []
            stub.add_response("get_products", {"PriceList": entries, "FormatVersion": "aws_v1"})
        ec2 = client(moto_endpoint, "ec2", region="eu-west-1")
        report = refresh(
            catalog_copy, ["eu-west-1"], pricing=pricing, ec2_for=lambda r: ec2, now=NOW
        )
        history = ec2.describe_spot_price_history(InstanceTypes=["p4d.24xlarge"])
        stub.assert_no_pending_responses()
    spot = max(float(entry["SpotPrice"]) for entry in history["SpotPriceHistory"])

    after = load_catalog(catalog_copy).prices
    ireland = after.region("eu-west-1")
    assert set(ireland) == set(offered)
    p4d = ireland["p4d.24xlarge"]
    assert p4d.on_demand_usd_per_hour == 24.15 and not p4d.on_demand_estimated
    assert p4d.spot_usd_per_hour == spot and not p4d.spot_estimated
    assert p4d.checked == NOW.date() and "Price List API" in p4d.sources.on_demand
    assert after.region("us-east-1") == before.prices.region("us-east-1")  # untouched
    assert report.startswith("eu-west-1: 2 types priced; not offered there: ")


@pytest.mark.parametrize(
    ("region", "usd"), [("eu-west-1", "0.1130000000"), ("ap-south-1", "0.1010000000")]
)
def test_refresh_rewrites_or_adds_the_head_nodes_price_in_parallelcluster_toml(
    catalog_copy, moto_endpoint, region, usd
):
    shutil.copy(CATALOG_DIR / "parallelcluster.toml", catalog_copy / "parallelcluster.toml")
    later = NOW + datetime.timedelta(days=40)  # after the file's own prices_checked
    before = load_parallelcluster(catalog_copy / "parallelcluster.toml")
    pricing = boto3.client("pricing", region_name=PRICE_LIST_REGION, **FAKE_CREDENTIALS)
    reset(moto_endpoint)
    with Stubber(pricing) as stub:
        for instance_type in load_catalog(catalog_copy).instances:
            entries = [price_list_entry(instance_type, region, "24.15")]
            stub.add_response("get_products", {"PriceList": entries, "FormatVersion": "aws_v1"})
        head = [price_list_entry("m5.large", region, usd)]
        stub.add_response("get_products", {"PriceList": head, "FormatVersion": "aws_v1"})
        ec2 = client(moto_endpoint, "ec2", region=region)
        report = refresh(catalog_copy, [region], pricing=pricing, ec2_for=lambda r: ec2, now=later)
        stub.assert_no_pending_responses()

    after = load_parallelcluster(catalog_copy / "parallelcluster.toml")
    price = after.head_node.price_in(region)
    assert price.on_demand_usd_per_hour == float(usd) and not price.on_demand_estimated
    assert "Price List API" in price.source and later.date().isoformat() in price.source
    # The other regions and the releases are as they were.
    others = {r: p for r, p in after.head_node.prices.items() if r != region}
    assert others == {r: p for r, p in before.head_node.prices.items() if r != region}
    assert after.releases == before.releases
    assert after.head_node.prices_checked == later.date()
    assert f"{region}: head node m5.large ${float(usd)}/h" in report
