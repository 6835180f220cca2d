"""A Slurm cluster's NAT gateway and its public address in the spend guard's ledger: billed by
the hour while they exist ("Amazon VPC pricing", NAT gateway; public IPv4 addresses), nodes
or no nodes, past a budget stop too.

moto lists NAT gateways but dates them on the real clock; the guard runs on the simulated
one, so DescribeNatGateways answers here with gateways dated in the simulated week, in the
shape the EC2 API Reference gives (NatGateway: NatGatewayId, State, CreateTime, DeleteTime,
NatGatewayAddresses).
"""

from __future__ import annotations

import datetime

import pytest

from tests.infra.functions.world import (
    COST_TAG,
    PUBLIC_IPV4_USD_PER_HOUR,
    World,
    guard,
    settings,
)

MONDAY = datetime.datetime(2026, 12, 7, tzinfo=datetime.UTC)
NAT_USD_PER_HOUR = 0.045


class NatGateways:
    """moto's EC2, but for DescribeNatGateways, which lists `gateways` carrying the stack's tag."""

    def __init__(self, ec2, gateways: list[dict]) -> None:
        self._ec2, self.gateways, self.filters = ec2, gateways, []

    def __getattr__(self, name):
        return getattr(self._ec2, name)

    def get_paginator(self, operation: str):
        if operation != "describe_nat_gateways":
            return self._ec2.get_paginator(operation)
        outer = self

        class Pages:
            def paginate(self, Filters):
                outer.filters.append(Filters)
                return [{"NatGateways": list(outer.gateways)}]

        return Pages()


def gateway(created, deleted=None, state="available") -> dict:
    return {
        "NatGatewayId": "nat-0123456789abcdef0",
        "State": "deleted" if deleted else state,
        "CreateTime": created,
        **({"DeleteTime": deleted} if deleted else {}),
        "NatGatewayAddresses": [{"AllocationId": "eipalloc-0abc", "PublicIp": "203.0.113.9"}],
    }


def test_the_nat_gateway_and_its_address_count_from_creation_to_deletion(aws, topic):
    topic_arn, _ = topic
    world = World(aws["ec2"], MONDAY)
    config = settings(
        topic_arn, 1000.0, cluster_name="demo", nat_gateway_usd_per_hour=NAT_USD_PER_HOUR
    )
    ec2 = NatGateways(aws["ec2"], [])
    guard(aws, world, config, ec2=ec2)  # the period's ledger, up to Monday 00:00
    before = None
    for minute in range(5, 181, 5):
        world.advance(minutes=5)
        if minute == 10:
            ec2.gateways = [gateway(MONDAY + datetime.timedelta(minutes=7))]
        if minute == 100:  # deleted at 1:37, listed with its DeleteTime from then on
            ec2.gateways = [
                gateway(ec2.gateways[0]["CreateTime"], MONDAY + datetime.timedelta(minutes=97))
            ]
        outcome = guard(aws, world, config, ec2=ec2)
        before = before if before is not None else outcome.ledger.spent_usd
    hours = 90 / 60  # 0:07 to 1:37
    assert outcome.ledger.spent_usd == pytest.approx(
        hours * (NAT_USD_PER_HOUR + PUBLIC_IPV4_USD_PER_HOUR)
    )
    assert not outcome.ledger.stopped
    assert ec2.filters[-1] == [{"Name": f"tag:{COST_TAG[0]}", "Values": [COST_TAG[1]]}]


def test_a_stopped_stacks_nat_gateway_goes_on_counting(aws, topic):
    """Past the budget the guard stops the nodes; the NAT gateway, which no stop ends, is
    still counted, so the ledger says what the stack costs until `down`."""
    topic_arn, _ = topic
    world = World(aws["ec2"], MONDAY)
    config = settings(
        topic_arn, 0.01, cluster_name="demo", nat_gateway_usd_per_hour=NAT_USD_PER_HOUR
    )
    ec2 = NatGateways(aws["ec2"], [gateway(MONDAY - datetime.timedelta(hours=1))])
    first = guard(aws, world, config, ec2=ec2)
    world.advance(hours=2)
    later = guard(aws, world, config, ec2=ec2)
    assert first.ledger.stopped and later.ledger.stopped
    assert later.ledger.spent_usd - first.ledger.spent_usd == pytest.approx(
        2 * (NAT_USD_PER_HOUR + PUBLIC_IPV4_USD_PER_HOUR)
    )


def test_a_nat_gateway_the_guard_has_no_price_for_stops_the_stack_rather_than_count_it_free(
    aws, topic
):
    topic_arn, _ = topic
    world = World(aws["ec2"], MONDAY)
    config = settings(topic_arn, 1000.0, cluster_name="demo")  # no NAT gateway rate
    ec2 = NatGateways(aws["ec2"], [gateway(MONDAY - datetime.timedelta(hours=1))])
    outcome = guard(aws, world, config, ec2=ec2)
    assert outcome.ledger.stopped
    assert "no price in us-east-1 for NAT gateway (NAT gateway, nat-0123456789abcdef0)" in (
        outcome.ledger.stop_reason
    )
