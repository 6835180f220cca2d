"""prices.toml: prices per region, checked on load; a region or type without one is refused."""

from __future__ import annotations

import calendar
import datetime
import re

import pytest

from infra.errors import ConfigError
from infra.knowledge.catalog import CATALOG_DIR, load_catalog
from infra.knowledge.prices import MAX_PRICE_AGE_DAYS, PRICE_CUT
from tests.support.infra import modified_catalog


def test_each_required_region_prices_the_catalog_types_and_says_where_from():
    catalog = load_catalog()
    prices = catalog.prices
    assert set(prices.regions) >= {"us-east-1", "us-west-2", "eu-west-1"}
    assert set(prices.region("us-east-1")) == set(catalog.instances)
    p4d = prices.price("us-east-1", "p4d.24xlarge")
    assert p4d.on_demand_usd_per_hour == pytest.approx(21.96) and not p4d.on_demand_upper_bound
    assert p4d.by_market() == {"on-demand": 21.96, "spot": 14.1051, "capacity-block": 11.8}
    for region, table in prices.regions.items():
        for instance_type, price in table.items():
            assert (price.region, price.instance_type) == (region, instance_type)
            assert 0 < price.spot_usd_per_hour <= price.on_demand_usd_per_hour
            sources = [price.sources.on_demand, price.sources.spot]
            # Public sources only, and every estimate says it is one.
            assert all(source and "reference/" not in source for source in sources)
            assert price.on_demand_estimated == sources[0].startswith("estimate")
            assert price.spot_estimated == sources[1].startswith("estimate")


# Public list prices after AWS's June 2025 cut (AWS What's New, 2025-06-05): p4d.24xlarge in
# us-east-1 went from $32.77/h to $21.96/h.
P4D_US_EAST_1_AFTER_THE_CUT = 21.96


def test_p4d_in_us_east_1_is_priced_after_the_june_2025_cut():
    p4d = load_catalog().prices.price("us-east-1", "p4d.24xlarge")
    assert abs(p4d.on_demand_usd_per_hour / P4D_US_EAST_1_AFTER_THE_CUT - 1) <= 0.05


# Effective instance rates of EC2 Capacity Blocks for ML in the priced regions, as AWS's pricing
# page (aws.amazon.com/ec2/capacityblocks/pricing/) gave them on 2026-07-22; a type AWS offers
# no block of there (the G types, p3, p5e in us-east-1, anything in eu-west-1) has none.
CAPACITY_BLOCKS_2026_07_22 = {
    ("us-east-1", "p4d.24xlarge"): 11.8,
    ("us-east-1", "p4de.24xlarge"): 17.712,
    ("us-east-1", "p5.48xlarge"): 41.528,
    ("us-east-1", "p5en.48xlarge"): 54.92,
    ("us-west-2", "p4d.24xlarge"): 11.8,
    ("us-west-2", "p4de.24xlarge"): 17.712,
    ("us-west-2", "p5.48xlarge"): 41.528,
    ("us-west-2", "p5e.48xlarge"): 47.76,
    ("us-west-2", "p5en.48xlarge"): 54.92,
}


def test_capacity_block_rates_are_the_pricing_pages_after_the_june_2025_cut():
    blocks = {
        (region, instance_type): price.capacity_block_usd_per_hour
        for region, table in load_catalog().prices.regions.items()
        for instance_type, price in table.items()
        if price.capacity_block_usd_per_hour is not None
    }
    assert blocks == CAPACITY_BLOCKS_2026_07_22
    for region, instance_type in blocks:
        source = load_catalog().prices.price(region, instance_type).sources.capacity_block
        assert "aws.amazon.com/ec2/capacityblocks/pricing/" in source and "2026-07-22" in source


def test_every_row_has_a_source_for_each_price_and_is_recent():
    """Fails as rows age: refresh them (`python -m infra prices --refresh`) and re-date them."""
    today = datetime.datetime.now(datetime.UTC).date()
    for region, table in load_catalog().prices.regions.items():
        for instance_type, price in table.items():
            row = f"{region} {instance_type}"
            assert price.sources.on_demand and price.sources.spot, row
            assert (price.capacity_block_usd_per_hour is None) == (
                price.sources.capacity_block is None
            ), row
            assert price.checked >= datetime.date(2025, 6, 1), row
            assert (today - price.checked).days <= MAX_PRICE_AGE_DAYS, (
                f"{row} was checked {price.checked}, over {MAX_PRICE_AGE_DAYS} days ago"
            )
            assert not price.on_demand_upper_bound, row


MONTHS = list(calendar.month_name)[1:]  # January ... December


def source_dates(source: str) -> list[datetime.date]:
    """The days (2025-06-05) and months (May 2026, as its first day) a source names."""
    days = [datetime.date.fromisoformat(day) for day in re.findall(r"\d{4}-\d{2}-\d{2}", source)]
    months = re.findall(rf"({'|'.join(MONTHS)}) (\d{{4}})", source)
    return days + [datetime.date(int(year), MONTHS.index(month) + 1, 1) for month, year in months]


def test_every_price_names_a_source_dated_after_the_june_2025_cut():
    """On-demand, spot and Capacity Block: each figure's source says when it was true (an
    estimate, when what it was made from was true), on or after 2025-06-01."""
    for region, table in load_catalog().prices.regions.items():
        for instance_type, price in table.items():
            sources = [price.sources.on_demand, price.sources.spot, price.sources.capacity_block]
            for source in filter(None, sources):
                assert any(day >= PRICE_CUT for day in source_dates(source)), (
                    f"{region} {instance_type}: {source}"
                )


def test_a_source_date_is_read_as_written():
    assert source_dates("AWS What's New 2025-06-05; a playbook of May 2026") == [
        datetime.date(2025, 6, 5),
        datetime.date(2026, 5, 1),
    ]
    assert source_dates("SkyPilot AWS catalog vms.csv, us-east-1") == []


def test_a_region_is_priced_with_its_own_figures():
    prices = load_catalog().prices
    ireland = prices.price("eu-west-1", "p4d.24xlarge")
    virginia = prices.price("us-east-1", "p4d.24xlarge")
    # p4d.24xlarge on demand: $23.71569/h in EU (Ireland), $21.96/h in US East (N. Virginia).
    assert (ireland.on_demand_usd_per_hour, virginia.on_demand_usd_per_hour) == (23.71569, 21.96)
    assert "eu-west-1" in ireland.sources.on_demand and "eu-west-1" in ireland.sources.spot


def test_a_region_without_prices_is_refused_naming_the_regions_that_have_them():
    with pytest.raises(ConfigError) as caught:
        load_catalog().prices.region("eu-west-3")
    message = str(caught.value)
    assert "\n" not in message
    assert "'eu-west-3'" in message and "eu-west-1, us-east-1, us-west-2" in message


def test_a_type_a_region_does_not_price_is_refused():
    with pytest.raises(ConfigError, match=r"no price for p4de\.24xlarge in eu-west-1.*us-east-1"):
        load_catalog().prices.price("eu-west-1", "p4de.24xlarge")


P3 = '[region."us-east-1"."p3.2xlarge"]\non_demand_usd_per_hour = 3.06\nspot_usd_per_hour = 0.5576'


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        pytest.param(
            P3, P3.replace("= 3.06", "= -3.06"),
            ["region 'us-east-1', type 'p3.2xlarge'", "field 'on_demand_usd_per_hour'", "-3.06"],
            id="negative-price",
        ),
        pytest.param(
            P3, P3.replace("= 3.06", '= "3.06"'),
            ["field 'on_demand_usd_per_hour'", "'3.06'"],
            id="price-as-text",
        ),
        pytest.param(
            P3, P3.replace("= 0.5576", "= 4.0"),
            ["field 'spot_usd_per_hour'", "4.0", "3.06", "never dearer"],
            id="spot-above-on-demand",
        ),
        pytest.param(
            P3, P3 + "\nspto = 1.0",
            ["type 'p3.2xlarge'", "field 'spto'", "unknown"],
            id="unknown-field",
        ),
        pytest.param(
            P3 + "\non_demand_upper_bound = false\non_demand_estimated = false\n"
            "spot_estimated = false\nchecked = 2026-12-01",
            P3 + "\non_demand_upper_bound = false\non_demand_estimated = false\n"
            "spot_estimated = false\nchecked = 2025-05-31",
            ["field 'checked'", "2025-05-31", "before AWS's June 2025", "--refresh"],
            id="before-the-price-cut",
        ),
        pytest.param(
            '[region."us-east-1"."p3.2xlarge"]', '[region."us-east-1"."p3.3xlarge"]',
            ["type 'p3.3xlarge'", "not an instance type of instances.toml"],
            id="type-not-in-catalog",
        ),
    ],
)  # fmt: skip
def test_a_bad_price_is_rejected_naming_region_type_and_field(tmp_path, old, new, expected):
    with pytest.raises(ConfigError) as caught:
        load_catalog(modified_catalog(tmp_path, "prices.toml", old, new))
    message = str(caught.value)
    assert "\n" not in message
    for part in expected:
        assert part in message


def test_each_priced_region_has_its_ebs_and_public_ipv4_rates_with_dated_sources():
    prices = load_catalog().prices
    today = datetime.datetime.now(datetime.UTC).date()
    for region in prices.regions:
        rates = prices.volumes_and_addresses(region)
        assert rates.region == region
        # The volume types DescribeVolumes reports, each priced: none counts as free.
        assert set(rates.ebs_usd_per_gb_month) == {
            "gp3", "gp2", "io1", "io2", "st1", "sc1", "standard"
        }  # fmt: skip
        assert rates.ebs_estimated == rates.sources.ebs.startswith("estimate")
        assert rates.public_ipv4_estimated == rates.sources.public_ipv4.startswith("estimate")
        assert (today - rates.checked).days <= MAX_PRICE_AGE_DAYS, region
    # Amazon EBS pricing (aws.amazon.com/ebs/pricing/): gp3 $0.08 a GB-month in US East
    # (N. Virginia), $0.088 in EU (Ireland); public IPv4 $0.005/h in every commercial region
    # (AWS News Blog, 2023-07-28).
    assert prices.volumes_and_addresses("us-east-1").ebs_usd_per_gb_month["gp3"] == 0.08
    assert prices.volumes_and_addresses("eu-west-1").ebs_usd_per_gb_month["gp3"] == 0.088
    assert {prices.volumes_and_addresses(r).public_ipv4_usd_per_hour for r in prices.regions} == {
        0.005
    }


def test_volume_and_address_rates_for_an_unpriced_region_are_refused_as_its_prices_are():
    with pytest.raises(ConfigError, match=r"no prices for region 'eu-west-3'"):
        load_catalog().prices.volumes_and_addresses("eu-west-3")


RATES_FILE = "volume_and_address_prices.toml"


def test_a_region_with_instance_prices_but_no_volume_and_address_rates_is_refused(tmp_path):
    text = (CATALOG_DIR / RATES_FILE).read_text()
    ireland = text[text.index('[region."eu-west-1"]') :]
    prices = load_catalog(modified_catalog(tmp_path, RATES_FILE, ireland, "")).prices
    with pytest.raises(ConfigError) as caught:
        prices.volumes_and_addresses("eu-west-1")
    message = str(caught.value)
    assert "\n" not in message
    assert "no EBS and public IPv4 rates for region 'eu-west-1'" in message
    assert "us-east-1, us-west-2" in message and RATES_FILE in message


def test_a_bad_volume_rate_is_rejected_naming_region_and_field(tmp_path):
    with pytest.raises(ConfigError) as caught:
        load_catalog(modified_catalog(tmp_path, RATES_FILE, "gp3 = 0.08", "gp3 = -0.08"))
    message = str(caught.value)
    assert "\n" not in message
    assert "region 'us-east-1'" in message and "ebs_usd_per_gb_month" in message
    assert "-0.08" in message
