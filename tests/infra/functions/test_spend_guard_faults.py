"""The spend guard where the plain case ends: clusters, capacity blocks, faults and edges.

Each test runs the guard every five simulated minutes against moto (tests/infra/functions/
world.py) and checks its ledger and its stop against spend summed from the world's own record
of when each instance ran, or against figures worked out by hand in the test.
"""

from __future__ import annotations

import datetime

import pytest

from infra.functions.ledger import read_item, read_ledger
from tests.infra.functions.world import (
    HEAD_NODE_TYPE,
    PRICES,
    PUBLIC_IPV4_USD_PER_HOUR,
    SCHEDULE,
    Ec2,
    Failing,
    World,
    guard,
    notices,
    root_volume_hourly,
    settings,
)
from tests.support.aws import fleet_table

MONDAY = datetime.datetime(2026, 12, 7, tzinfo=datetime.UTC)
DECEMBER = datetime.datetime(2026, 12, 1, tzinfo=datetime.UTC)  # a period's first instant
P4D = PRICES["p4d.24xlarge"]
RUN_HOURS = SCHEDULE.total_seconds() / 3600
STACK = "gpu-training-stack-test"
# What each running node bills beside its price in December: its address and root volume.
BESIDE = PUBLIC_IPV4_USD_PER_HOUR + root_volume_hourly(31)


def every_run(world: World, minutes: int, run, events=None):
    """Call run() every five minutes for `minutes`, after that minute's events."""
    for minute in range(minutes + 1):
        for event in (events or {}).get(minute, ()):
            event()
        if minute % 5 == 0:
            run(minute)
        world.advance(minutes=1)


# $50 at 2 x $9.90 + $0.192 an hour (spot) and three nodes' addresses and volumes
# ($0.0061 each) lasts 149.92 minutes, at 2 x $32.7726 + $0.192 (on-demand) 45.62 minutes: the
# runs at minutes 150 and 50 stop them.
@pytest.mark.parametrize(
    ("spot", "hourly", "stop"),
    [(True, 2 * 9.9 + 0.192 + 3 * BESIDE, 150), (False, 2 * 32.7726 + 0.192 + 3 * BESIDE, 50)],
    ids=["spot", "on-demand"],
)
def test_a_cluster_is_stopped_the_parallelcluster_way_within_one_run(
    aws, topic, spot, hourly, stop
):
    budget = 50.0
    runs_out = budget / hourly * 60
    topic_arn, queue = topic
    world = World(aws["ec2"], MONDAY)
    ec2 = Ec2(aws["ec2"], world)  # EC2 refuses to stop the one-time spot compute nodes
    table = fleet_table(aws["dynamodb"], "demo")
    config = settings(topic_arn, budget, cluster_name="demo")
    head = world.launch(HEAD_NODE_TYPE, node_type="HeadNode")
    compute = {world.launch(spot=spot, node_type="Compute") for _ in range(2)}
    stops = []

    def run(minute):
        hourly = world.hourly()
        outcome = guard(aws, world, config, ec2=ec2)
        if outcome.ledger.stopped and not stops:
            stops.append(minute)
            assert set(outcome.terminated_instances) == compute
            assert outcome.stopped_instances == (head,) and outcome.unstoppable == ()
            assert world.running_ids() == set()
            assert 0 <= world.spend() - budget <= hourly * RUN_HOURS

    minutes = stop + 30  # half an hour of runs past the stop: it holds
    every_run(world, minutes, run)

    assert stops == [stop]
    # Past the stop only the stopped head node's root volume bills (the compute nodes' went
    # with them).
    after_stop = (minutes - stop) / 60 * root_volume_hourly(31)
    assert world.spend() - budget == pytest.approx(
        hourly * (stop - runs_out) / 60 + after_stop, abs=0.01
    )
    fleet = aws["dynamodb"].get_item(TableName=table, Key={"Id": {"S": "COMPUTE_FLEET"}})["Item"]
    assert fleet["Data"]["M"]["status"]["S"] == "STOP_REQUESTED"
    stopped_at = MONDAY + datetime.timedelta(minutes=stop)
    assert fleet["Data"]["M"]["lastStatusUpdatedTime"]["S"] == str(stopped_at)
    subjects = notices(aws["sqs"], queue)
    assert subjects.count(f"{STACK}: spend guard terminated 2 node(s)") == 1
    assert subjects.count(f"{STACK}: spend guard stopped 1 instance(s)") == 1


def test_a_one_time_spot_instance_ec2_will_not_stop_is_terminated(aws, topic):
    topic_arn, _ = topic
    world = World(aws["ec2"], MONDAY)
    node = world.launch(spot=True)
    world.advance(hours=10)  # $99 of a $50 budget
    outcome = guard(aws, world, settings(topic_arn, 50.0), ec2=Ec2(aws["ec2"], world))
    assert outcome.terminated_instances == (node,) and outcome.unstoppable == ()
    assert world.running_ids() == set()


@pytest.mark.parametrize(
    "corrupt",
    [
        pytest.param(lambda item: item.update(spent_usd={"S": "lots"}), id="wrong-type"),
        pytest.param(lambda item: item.pop("running"), id="missing-field"),
        pytest.param(
            lambda item: item.update(accounted_until={"S": "2026-12-09T00:00:00+00:00"}),
            id="future-dated",
        ),
    ],
)
def test_an_unreadable_ledger_item_is_reported_once_and_the_stack_still_stops(aws, topic, corrupt):
    topic_arn, queue = topic
    world = World(aws["ec2"], DECEMBER)
    config = settings(topic_arn, 100.0)
    world.launch()
    stops = []

    def spoil():
        item = read_item(aws["dynamodb"], "ledger", "2026-12")
        corrupt(item)
        aws["dynamodb"].put_item(TableName="ledger", Item=item)

    def run(minute):
        outcome = guard(aws, world, config)
        assert outcome.ledger.spent_usd >= world.spend() - 1e-6
        if outcome.ledger.stopped and not stops:
            stops.append(minute)

    every_run(world, 240, run, {62: [spoil]})

    # $100 at $32.7726/h lasts 183.08 minutes: the run at minute 185 stops it.
    assert stops == [185]
    assert world.spend() - 100.0 <= P4D["on-demand"] * RUN_HOURS
    subjects = notices(aws["sqs"], queue)
    assert subjects.count(f"{STACK}: spend guard problem") == 1


@pytest.mark.parametrize("operation", ["put_item", "get_item"], ids=["write", "read"])
def test_a_ledger_that_fails_at_the_budget_does_not_delay_the_stop(aws, topic, operation):
    topic_arn, _ = topic
    world = World(aws["ec2"], DECEMBER)
    config = settings(topic_arn, 100.0)
    node = world.launch()
    throttled = Failing(aws["dynamodb"], operation, "ProvisionedThroughputExceededException")
    stopped = []

    def run(minute):
        failing = 150 <= minute < 240
        outcome = guard(aws, world, config, dynamodb=throttled if failing else aws["dynamodb"])
        if failing:
            assert any("ledger could not be" in p for p in outcome.problems)
        if outcome.stopped_instances:
            stopped.append((minute, outcome.stopped_instances))

    every_run(world, 250, run)  # the table answers again at the runs of minutes 240 to 250

    assert stopped == [(185, (node,))]  # the same run as with a healthy table
    assert world.spend() - 100.0 <= P4D["on-demand"] * RUN_HOURS
    # Once the table takes writes again the ledger holds the whole spend.
    assert read_ledger(aws["dynamodb"], "ledger", "2026-12").spent_usd == pytest.approx(
        world.spend()
    )


def test_a_capacity_block_is_counted_once_up_front_and_never_stopped(aws, topic):
    topic_arn, queue = topic
    world = World(aws["ec2"], MONDAY)
    ec2 = Ec2(aws["ec2"], world)
    world.buy_block("cr-0123456789abcdef0", "p4d.24xlarge", count=2, hours=48)
    config = settings(topic_arn, 1000.0, capacity_block_id="cr-0123456789abcdef0")
    block = {world.launch(capacity_block=True) for _ in range(2)}
    head = world.launch(HEAD_NODE_TYPE, node_type="HeadNode")
    outcomes = []
    minutes = 2 * 60  # 25 runs, each of which could count the block again
    every_run(world, minutes, lambda minute: outcomes.append(guard(aws, world, config, ec2=ec2)))

    fee = 48 * 2 * 14.75  # hours x instances x the block's rate: $1,416, over the budget
    assert outcomes[0].ledger.spent_usd == pytest.approx(fee)
    assert outcomes[0].ledger.stopped and outcomes[0].stopped_instances == (head,)
    # Counted once; the block's nodes' addresses and volumes, and the stopped head node's
    # volume, bill beside it.
    assert outcomes[-1].ledger.spent_usd == pytest.approx(fee + world.spend())
    hours = (minutes + 1) / 60  # the world's clock after its last run
    assert world.spend() == pytest.approx(2 * hours * BESIDE + hours * root_volume_hourly(31))
    assert world.running_ids() == block
    assert notices(aws["sqs"], queue).count(f"{STACK}: spend guard stopped 1 instance(s)") == 1


def test_a_notice_sns_did_not_take_is_sent_at_the_next_run(aws, topic):
    topic_arn, queue = topic
    world = World(aws["ec2"], MONDAY)
    config = settings(topic_arn, 100.0)
    world.launch()
    world.advance(hours=2)  # $65.55: past 50%
    down = guard(aws, world, config, sns=Failing(aws["sns"], "publish", "InternalError"))
    assert down.notices == () and notices(aws["sqs"], queue) == []
    world.advance(minutes=5)
    up = guard(aws, world, config)
    assert up.notices == (f"{STACK}: spend passed 50% of its budget",)
    assert up.ledger.unsent == ()
    assert notices(aws["sqs"], queue) == [f"{STACK}: spend passed 50% of its budget"]


def test_an_instance_pending_at_one_run_and_stopped_before_the_next_is_counted(aws, topic):
    topic_arn, _ = topic
    world = World(aws["ec2"], MONDAY)
    config = settings(topic_arn, 1000.0)
    node = world.pending()
    guard(aws, world, config)
    world.advance(minutes=1)
    world.run(node)
    world.advance(minutes=2)
    world.stop(node)
    world.advance(minutes=2)
    ledger = guard(aws, world, config).ledger
    # Two minutes running; its volume from the launch, five.
    expected = (P4D["on-demand"] + PUBLIC_IPV4_USD_PER_HOUR) * 2 / 60
    assert world.spend() == pytest.approx(expected + root_volume_hourly(31) * 5 / 60)
    assert world.spend() <= ledger.spent_usd <= world.spend() + P4D["on-demand"] * RUN_HOURS


def test_the_old_period_is_counted_to_its_last_instant(aws, topic):
    topic_arn, _ = topic
    world = World(aws["ec2"], datetime.datetime(2026, 11, 30, 22, 0, tzinfo=datetime.UTC))
    config = settings(topic_arn, 10_000.0)
    world.launch()
    world.advance(minutes=117)
    guard(aws, world, config)  # 23:57, the period's last run
    world.advance(minutes=5)
    guard(aws, world, config)  # 00:02
    november = read_ledger(aws["dynamodb"], "ledger", "2026-11")
    december = read_ledger(aws["dynamodb"], "ledger", "2026-12")
    # 22:00 to midnight, the volume at November's (30-day) monthly rate.
    november_hourly = P4D["on-demand"] + PUBLIC_IPV4_USD_PER_HOUR + root_volume_hourly(30)
    assert november.spent_usd == pytest.approx(november_hourly * 2)
    assert november.accounted_until == "2026-12-01T00:00:00+00:00"
    assert december.spent_usd == pytest.approx((P4D["on-demand"] + BESIDE) * 2 / 60)


def test_each_undated_interruption_counts_at_most_one_run_too_much(aws, topic):
    topic_arn, _ = topic
    world = World(aws["ec2"], MONDAY)
    config = settings(topic_arn, 10_000.0)
    current = [world.launch(spot=True)]

    def interrupt_and_replace():
        world.interrupt(current[-1])
        current.append(world.launch(spot=True))

    # Each a minute after a run: EC2 gives no time, so each is counted up to the next run.
    events = {minute: [interrupt_and_replace] for minute in (61, 121, 181, 241, 301)}
    overs = []

    def run(minute):
        overs.append(guard(aws, world, config).ledger.spent_usd - world.spend())

    every_run(world, 6 * 60, run, events)
    over = overs[-1]
    assert min(overs) >= -1e-6
    # Each ended 4 minutes before a run, its address and its volume with it.
    assert over <= 5 * (P4D["spot"] + BESIDE) * RUN_HOURS + 1e-6
    assert over == pytest.approx(5 * (P4D["spot"] + BESIDE) * 4 / 60)
