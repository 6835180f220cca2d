"""`offers` against the catalog: order, filters and region, expected from the data file itself."""

import tomllib

import pytest

from common.market import Market
from infra.commands.offers import select_offers
from infra.knowledge.catalog import CATALOG_DIR, load_catalog
from tests.support.infra import run_cli

HARDWARE = tomllib.loads((CATALOG_DIR / "instances.toml").read_text())["instance"]
PRICES = tomllib.loads((CATALOG_DIR / "prices.toml").read_text())["region"]


def _expected(keep, price_key="on_demand_usd_per_hour", region="us-east-1"):
    """Types priced in `region` that `keep` accepts (a row: hardware and price keys together)."""
    rows = {t: {**HARDWARE[t], **price} for t, price in PRICES[region].items()}
    chosen = [t for t, row in rows.items() if keep(row)]
    return sorted(chosen, key=lambda t: (rows[t][price_key], t))


def _type_column(stdout: str) -> list[str]:
    lines = stdout.splitlines()
    assert lines[0].split()[0] == "TYPE"
    rows = lines[1 : lines.index("")]
    return [line.split()[0] for line in rows]


def test_a100_with_eight_gpus_lists_p4d_then_p4de_cheapest_first():
    result = run_cli("offers", "--gpu", "A100", "--min-gpus", "8")
    assert result.returncode == 0, result.stderr
    expected = _expected(lambda r: r["gpu_model"] == "A100" and r["gpu_count"] >= 8)
    assert set(expected) == {"p4d.24xlarge", "p4de.24xlarge"}
    assert _type_column(result.stdout) == expected
    p4d = PRICES["us-east-1"]["p4d.24xlarge"]
    row = next(line for line in result.stdout.splitlines() if line.startswith("p4d.24xlarge"))
    assert f"${p4d['on_demand_usd_per_hour']:,.2f}" in row
    assert f"${p4d['spot_usd_per_hour']:,.2f}" in row
    assert f"${p4d['capacity_block_usd_per_hour']:,.2f}" in row
    assert "NVSwitch" in row and " 40 " in row and "a100x8" in row.split()


def test_l4_is_offered_with_its_profile():
    result = run_cli("offers", "--gpu", "L4")
    assert result.returncode == 0, result.stderr
    # us-east-1 on demand: g6.xlarge $0.8048/h, g6.2xlarge $0.9776/h, g6.48xlarge $13.3504/h.
    assert _type_column(result.stdout) == ["g6.xlarge", "g6.2xlarge", "g6.48xlarge"]
    row = result.stdout.splitlines()[2].split()
    # g6.2xlarge: 1x L4 24 GB, $0.9776/h on-demand and $0.5324/h spot in us-east-1.
    assert row[:5] == ["g6.2xlarge", "L4", "1", "24", "none"]
    assert row[5:7] == ["$0.98", "$0.53"] and row[-1] == "l4x1"


def test_every_row_of_the_selection_guide_has_its_types_to_compare():
    result = run_cli("offers")
    assert result.returncode == 0, result.stderr
    families = {name.split(".")[0] for name in _type_column(result.stdout)}
    assert {"g5", "g6", "g6e", "p4d", "p4de", "p5", "p5e"} <= families


def test_every_type_by_on_demand_price():
    chosen = select_offers(load_catalog())
    assert [o.instance.type for o in chosen] == _expected(lambda r: True)


def test_spot_sorts_by_spot_and_caps_by_the_spot_price():
    chosen = select_offers(load_catalog(), market=Market.SPOT, max_price=15)
    expected = _expected(lambda r: r["spot_usd_per_hour"] <= 15, "spot_usd_per_hour")
    assert [o.instance.type for o in chosen] == expected
    # The cap is on the spot price: p4d's on-demand is far above it, its spot is not.
    p4d = PRICES["us-east-1"]["p4d.24xlarge"]
    assert p4d["on_demand_usd_per_hour"] > 15 and "p4d.24xlarge" in expected


def test_capacity_blocks_list_only_the_types_with_a_block_price():
    chosen = select_offers(load_catalog(), market=Market.CAPACITY_BLOCK)
    # us-east-1 effective rates, EC2 Capacity Blocks for ML pricing page
    # (aws.amazon.com/ec2/capacityblocks/pricing/, as of 2026-07-22), cheapest first.
    assert [(o.instance.type, o.price.capacity_block_usd_per_hour) for o in chosen] == [
        ("p4d.24xlarge", 11.8),
        ("p4de.24xlarge", 17.712),
        ("p5.48xlarge", 41.528),
        ("p5en.48xlarge", 54.92),
    ]
    result = run_cli("offers", "--market", "capacity-block", "--max-price", "20")
    assert result.returncode == 0, result.stderr
    assert _type_column(result.stdout) == ["p4d.24xlarge", "p4de.24xlarge"]
    assert "sorted by capacity-block" in result.stdout
    refused = run_cli("offers", "--market", "reservation")
    assert refused.returncode != 0 and "invalid choice: 'reservation'" in refused.stderr


def test_max_price_on_demand_and_gpu_model_in_any_case():
    chosen = select_offers(load_catalog(), gpu="l40s", max_price=15)
    expected = _expected(lambda r: r["gpu_model"] == "L40S" and r["on_demand_usd_per_hour"] <= 15)
    assert [o.instance.type for o in chosen] == expected and expected


def test_variants_are_those_the_resolver_runs_and_exclude_cpu():
    by_type = {o.instance.type: o for o in select_offers(load_catalog())}
    # The V100 type runs only variants whose wheels carry sm_70 and whose driver its AMI has.
    assert "cu130" not in by_type["p3.2xlarge"].variants  # CUDA 13 dropped sm_70
    assert "cu130" in by_type["p4d.24xlarge"].variants
    assert all("cpu" not in o.variants for o in by_type.values())


def test_another_region_has_its_own_prices_and_types():
    chosen = select_offers(load_catalog(), region="eu-west-1")
    assert [o.instance.type for o in chosen] == _expected(lambda r: True, region="eu-west-1")
    assert "p4de.24xlarge" not in PRICES["eu-west-1"]  # AWS does not offer it there
    p4d = next(o for o in chosen if o.instance.type == "p4d.24xlarge")
    assert (
        p4d.price.on_demand_usd_per_hour
        == PRICES["eu-west-1"]["p4d.24xlarge"]["on_demand_usd_per_hour"]
    )
    result = run_cli("offers", "--region", "eu-west-1", "--gpu", "A100")
    assert result.returncode == 0 and "eu-west-1" in result.stdout
    assert "p4de" not in result.stdout


def test_a_region_without_prices_is_a_one_line_error():
    result = run_cli("offers", "--region", "ap-south-2")
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1
    assert "--region ap-south-2" in result.stderr
    assert ", ".join(sorted(PRICES)) in result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--gpu", "B300"), "--gpu 'B300' is not in the catalog"),
        (("--min-gpus", "0"), "--min-gpus is 0"),
        (("--max-price", "-1"), "--max-price is -1"),
    ],
)
def test_bad_filters_exit_2_in_one_line(args, message):
    result = run_cli("offers", *args)
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert message in result.stderr


def test_no_match_says_so():
    result = run_cli("offers", "--gpu", "V100", "--min-gpus", "8")
    assert result.returncode == 0 and "no instance type in the catalog matches" in result.stdout
