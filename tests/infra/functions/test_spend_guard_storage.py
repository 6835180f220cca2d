"""What bills beside an instance's running time: its EBS volumes, stopped or not, and its
public IPv4 address while it runs; each priced by hand here from AWS's list prices."""

from __future__ import annotations

import datetime

import pytest
from moto.ec2.models import ec2_backends

from infra.functions.ledger import read_ledger
from infra.functions.volumes import usd_per_month
from tests.infra.functions.world import (
    EBS_USD_PER_GB_MONTH,
    GP2_USD_PER_GB_MONTH,
    PUBLIC_IPV4_USD_PER_HOUR,
    ROOT_VOLUME_GIB,
    World,
    guard,
    settings,
)
from tests.support.aws import ACCOUNT, REGION

MONDAY = datetime.datetime(2026, 12, 7, tzinfo=datetime.UTC)
DECEMBER_HOURS = 31 * 24
P4D = 32.7726  # world.PRICES
# us-east-1 (aws.amazon.com/ebs/pricing/): gp3 $0.08/GB-month with 3,000 IOPS and 125 MB/s
# included, $0.005 per IOPS-month and $0.04 per MB/s-month above; gp2 $0.10/GB-month.
# 200 GB, 4,000 IOPS, 500 MB/s: 16 + 5 + 15.
DATA_VOLUME_MONTHLY = 200 * 0.08 + 1000 * 0.005 + 375 * 0.04
ROOT_VOLUME_MONTHLY = ROOT_VOLUME_GIB * GP2_USD_PER_GB_MONTH
IPV4 = PUBLIC_IPV4_USD_PER_HOUR


@pytest.mark.parametrize(
    ("volume", "monthly"),
    [
        ({"VolumeType": "gp3", "Size": 200, "Iops": 4000, "Throughput": 500}, 36.0),
        ({"VolumeType": "gp3", "Size": 100, "Iops": 3000, "Throughput": 125}, 8.0),
        ({"VolumeType": "gp2", "Size": 8}, 0.8),
        ({"VolumeType": "io1", "Size": 100, "Iops": 1000}, 12.5 + 65.0),
        # A type the table lacks counts at its dearest rate (io1/io2, $0.125), never free.
        ({"VolumeType": "gp4", "Size": 100}, 12.5),
    ],
)
def test_a_volume_is_priced_by_size_type_and_provisioned_performance(volume, monthly):
    assert usd_per_month(volume, EBS_USD_PER_GB_MONTH) == pytest.approx(monthly)


def test_volumes_bill_while_stopped_and_the_address_only_while_running(aws, topic):
    topic_arn, _ = topic
    config = settings(topic_arn, 10_000.0)
    world = World(aws["ec2"], MONDAY)
    node = world.launch()
    data = aws["ec2"].create_volume(
        AvailabilityZone="us-east-1a", Size=200, VolumeType="gp3", Iops=4000, Throughput=500
    )["VolumeId"]
    ec2_backends[ACCOUNT][REGION].get_volume(data).create_time = MONDAY.replace(tzinfo=None)
    aws["ec2"].attach_volume(VolumeId=data, InstanceId=node, Device="/dev/sdf")
    guard(aws, world, config)
    world.advance(hours=1)
    world.stop(node)
    for _ in range(2 * 12):  # two stopped hours, a run every five minutes
        world.advance(minutes=5)
        ledger = guard(aws, world, config).ledger

    storage = 3 * (DATA_VOLUME_MONTHLY + ROOT_VOLUME_MONTHLY) / DECEMBER_HOURS
    assert ledger.spent_usd == pytest.approx(1 * (P4D + IPV4) + storage)
    assert dict(ledger.volumes)[data] == pytest.approx(DATA_VOLUME_MONTHLY)
    assert ledger.addressed == ()  # EC2 released the address at the stop


def test_a_volume_deleted_between_runs_is_counted_through_that_run_at_most(aws, topic):
    topic_arn, _ = topic
    config = settings(topic_arn, 10_000.0)
    world = World(aws["ec2"], MONDAY)
    node = world.launch()
    guard(aws, world, config)
    world.advance(minutes=2)
    world.terminate(node)  # its root volume goes with it (DeleteOnTermination)
    world.advance(minutes=3)
    guard(aws, world, config)
    world.advance(hours=5)
    ledger = guard(aws, world, config).ledger

    # Two minutes of the instance and its address; the volume's end is undated: five.
    expected = 2 / 60 * (P4D + IPV4) + 5 / 60 * ROOT_VOLUME_MONTHLY / DECEMBER_HOURS
    assert ledger.spent_usd == pytest.approx(expected)
    assert ledger.volumes == () and ledger.running == ()
    assert read_ledger(aws["dynamodb"], "ledger", "2026-12").spent_usd == pytest.approx(expected)
