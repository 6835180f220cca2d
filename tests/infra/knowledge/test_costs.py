import pytest

from common.market import Market
from infra.config.guardrails import GuardrailConfig
from infra.errors import ConfigError
from infra.knowledge.costs import cost_summary, hourly_usd, idle_cost, network_usd_per_hour
from infra.knowledge.parallelcluster import load_parallelcluster
from infra.knowledge.profiles import resolve_profile
from infra.knowledge.resolver import resolve
from tests.support.infra import data_file_prices

PROFILES = ("l4x1", "l40sx4", "a100x8-80g", "a100x8")


def test_p4d_on_demand_runway():
    plan = resolve_profile("a100x8")  # p4d.24xlarge: $21.96/h on-demand, $14.1051/h spot
    summary = cost_summary(plan, GuardrailConfig(budget_usd=500))
    assert summary.instance_type == "p4d.24xlarge"
    assert summary.market == "on-demand"
    assert summary.on_demand_usd_per_hour == 21.96
    assert summary.spot_usd_per_hour == 14.11
    assert summary.hourly_usd == 21.96
    assert summary.monthly_budget_usd == 500
    assert summary.runway_hours == 22.8  # 500 / 21.96
    assert summary.runway_hours_spot == 35.4  # 500 / 14.1051


def test_spot_market_sets_the_runway():
    plan = resolve_profile("a100x8")
    summary = cost_summary(plan, GuardrailConfig(budget_usd=500), market=Market.SPOT)
    assert summary.market == "spot"
    assert summary.hourly_usd == 14.11
    assert summary.runway_hours == summary.runway_hours_spot == 35.4
    assert summary.runway_hours_on_demand == 22.8


def test_costs_scale_with_nodes():
    one, two = resolve("p4d.24xlarge", nodes=1), resolve("p4d.24xlarge", nodes=2)
    config = GuardrailConfig(budget_usd=1000)
    # p4d.24xlarge: $21.96/h on-demand in us-east-1.
    assert (cost_summary(one, config).hourly_usd, cost_summary(two, config).hourly_usd) == (
        21.96,
        43.92,
    )
    # 1000 / 21.96 and 1000 / 43.92 hours.
    assert cost_summary(one, config).runway_hours == 45.5
    assert cost_summary(two, config).runway_hours == 22.8


def test_daily_budget_is_shown_per_month_and_max_run_priced():
    plan = resolve("p3.2xlarge")  # $3.06/h
    config = GuardrailConfig(budget_usd=30, budget_period="DAILY", max_runtime_hours=8)
    summary = cost_summary(plan, config)
    assert summary.budget_period == "DAILY"
    assert summary.monthly_budget_usd == round(30 * 365 / 12, 2)  # an average month
    assert summary.runway_hours == 9.8  # 30 / 3.06: hours per day of full load
    assert summary.max_run_usd == 24.48


@pytest.mark.parametrize("profile", PROFILES)
def test_every_profile_has_hourly_cost_and_runway(profile):
    plan = resolve_profile(profile)
    summary = cost_summary(plan, GuardrailConfig(budget_usd=1000))
    assert 0 < summary.spot_usd_per_hour < summary.on_demand_usd_per_hour
    on_demand = data_file_prices(plan.instance.type).on_demand_usd_per_hour * plan.nodes
    # A month has 730 hours: a budget that buys more buys the whole month.
    assert summary.runway_hours == round(min(1000 / on_demand, 730.0), 1)


@pytest.mark.parametrize(("period", "hours"), [("MONTHLY", 730.0), ("DAILY", 24.0)])
def test_the_runway_is_at_most_the_budget_period(period, hours):
    plan = resolve("g6.2xlarge")  # $0.9776/h on-demand, $0.5324/h spot
    config = GuardrailConfig(budget_usd=1_000_000, budget_period=period)
    summary = cost_summary(plan, config, market=Market.SPOT)
    assert summary.runway_hours == summary.runway_hours_on_demand == hours
    small = cost_summary(
        plan, GuardrailConfig(budget_usd=5, budget_period=period), market=Market.SPOT
    )
    assert small.runway_hours == round(5 / 0.5324, 1) == 9.4


def test_worst_case_overspend_is_one_guard_period_and_one_run_at_the_stacks_price():
    plan = resolve("p4d.24xlarge", nodes=2)
    summary = cost_summary(plan, GuardrailConfig(budget_usd=5000), market=Market.ON_DEMAND)
    # 5 minutes between runs plus a 60-second run, at two p4d.24xlarge on-demand.
    assert summary.worst_case_overspend_usd == round(2 * 21.96 * 6 / 60, 2)


def test_on_a_cluster_the_worst_case_overspend_has_time_for_the_jobs_checkpoint():
    plan = resolve("p4d.24xlarge", nodes=2, cluster=load_parallelcluster().release())
    summary = cost_summary(plan, GuardrailConfig(budget_usd=5000), market=Market.ON_DEMAND)
    # The run first holds the jobs: KillWait (120 s), their requeue (60 s) and SSM (30 s).
    assert summary.guard_timeout_s == 60 + 120 + 60 + 30
    assert summary.worst_case_overspend_usd == round(2 * 21.96 * (5 + 270 / 60) / 60, 2)


@pytest.mark.parametrize(
    ("market", "expected"),
    [
        (Market.ON_DEMAND, 2 * 21.96),
        (Market.SPOT, 2 * 14.1051),
        (Market.CAPACITY_BLOCK, 2 * 11.8),  # the block's effective rate, not on-demand's
        (Market.RESERVATION, 2 * 21.96),  # a reservation bills at the on-demand rate
    ],
)
def test_one_price_per_market(market, expected):
    plan = resolve("p4d.24xlarge", nodes=2)
    assert hourly_usd(plan, market) == pytest.approx(expected)
    summary = cost_summary(plan, GuardrailConfig(budget_usd=1000), market=market)
    assert summary.market == market and summary.hourly_usd == round(expected, 2)


def test_a_capacity_block_of_a_type_without_a_block_price_is_refused():
    plan = resolve("g5.xlarge")
    with pytest.raises(ConfigError) as caught:
        hourly_usd(plan, Market.CAPACITY_BLOCK)
    message = str(caught.value)
    assert "\n" not in message
    assert "no capacity-block price for g5.xlarge in us-east-1" in message
    assert "capacity_block_usd_per_hour" in message


@pytest.mark.parametrize(
    ("region", "gp3_usd_per_gb_month", "nat_gateway_usd_per_hour"),
    # Amazon EBS pricing (aws.amazon.com/ebs/pricing/): gp3 in US East (N. Virginia) and in
    # EU (Ireland); Amazon VPC pricing (aws.amazon.com/vpc/pricing/): a NAT gateway-hour.
    [("us-east-1", 0.08, 0.045), ("eu-west-1", 0.088, 0.048)],
)
def test_idle_root_volumes_and_leftover_addresses_are_priced_at_the_regions_rates(
    region, gp3_usd_per_gb_month, nat_gateway_usd_per_hour
):
    plan = resolve("g5.xlarge", nodes=2, region=region)
    # Two stopped nodes keep their 500 GiB gp3 root volumes.
    assert idle_cost(plan, 500).root_volumes_usd == pytest.approx(2 * 500 * gp3_usd_per_gb_month)
    # Two public IPv4 addresses at $0.005/h each, in every commercial region.
    assert network_usd_per_hour(region, public_ipv4_addresses=2) == pytest.approx(0.01)
    assert network_usd_per_hour(region, nat_gateways=1) == pytest.approx(nat_gateway_usd_per_hour)
