"""The spend guard against moto's EC2, DynamoDB and SNS (delivered to SQS), on a simulated clock."""

from __future__ import annotations

import dataclasses
import datetime

import pytest
from botocore.exceptions import ClientError

from infra.functions.ledger import read_ledger
from infra.functions.settings import GuardSettings, SettingsError
from infra.functions.spend_guard import handler, market, run_guard, running_hours
from tests.infra.functions.world import (
    COST_TAG,
    PRICES,
    PUBLIC_IPV4_USD_PER_HOUR,
    SCHEDULE,
    THRESHOLDS,
    World,
    guard,
    notices,
    root_volume_hourly,
    settings,
)
from tests.support.infra import data_file_head_node, data_file_prices
from tests.support.mock_runs import one
from tests.support.stack_runs import run_stack

MONDAY = datetime.datetime(2026, 12, 7, tzinfo=datetime.UTC)


@pytest.mark.slow(reason="every 5-minute run of the guard over 12 simulated hours", seconds=40)
def test_twelve_simulated_hours_are_counted_alerted_and_stopped_at_the_budget(aws, topic):
    topic_arn, queue = topic
    # Reached after every event of the script below; the hour after it shows the stop
    # holding, and by then the ledger's marks of more than six hours ago are thinned to
    # hourly ones.
    budget = 490.0
    minutes = 12 * 60
    config = settings(topic_arn, budget)
    world = World(aws["ec2"], MONDAY)
    # What happens when, in minutes since Monday 00:00 (between the guard's runs, mostly).
    on_demand, spot = world.launch(), world.launch(spot=True)
    stranger = world.launch(tagged=False)  # not the stack's: never counted, never stopped
    script = {
        62: lambda: world.stop(on_demand),
        180: lambda: world.start(on_demand),
        303: lambda: world.interrupt(spot),
        315: lambda: script_state.update(replacement=world.launch(spot=True)),
        421: lambda: script_state.update(dynamic=world.launch()),  # e.g. a Slurm node
        600: lambda: world.terminate(script_state["dynamic"]),
    }
    script_state: dict[str, str] = {}
    stop_run, spent_at_stop = None, 0.0
    worst_gap = 0.0  # the largest |ledger - true spend| seen after any run
    spent_by: dict[int, float] = {}  # minute -> the true spend by then, to read back later
    for minute in range(0, minutes + 1):
        if minute in script:
            script[minute]()
        # Old by the end (hourly marks) and recent ones (every run's), each in an hour of
        # steady spend: read back by interpolation between marks.
        if minute in (240, 270, minutes - 20):
            spent_by[minute] = world.spend()
        if minute % 5 == 0:
            hourly_before = world.hourly()
            outcome = guard(aws, world, config)
            ledger = outcome.ledger
            # Counted from EC2's facts, the ledger tracks the true spend within one run's worth.
            gap = ledger.spent_usd - world.spend()
            assert gap >= -1e-6, f"undercounted by ${-gap:.4f} at minute {minute}"
            worst_gap = max(worst_gap, gap)
            if ledger.stopped and stop_run is None:
                stop_run, spent_at_stop = minute, world.spend()
                # Within this one run every running instance of the stack was stopped.
                assert world.running_ids() == set()
                assert set(outcome.stopped_instances) == {on_demand, script_state["replacement"]}
                assert ledger.spent_usd >= budget
                overspend = world.spend() - budget
                assert overspend <= hourly_before * SCHEDULE.total_seconds() / 3600 + 1e-6
            elif stop_run is not None:
                assert outcome.stopped_instances == ()  # nothing runs: nothing to stop
                assert ledger.spent_usd == pytest.approx(world.spend() + gap, abs=1e-6)
        world.advance(minutes=1)
    subjects = notices(aws["sqs"], queue)

    assert stop_run is not None, "the budget was never reached"
    # The stack ran past its budget by at most one period of its price; after the stop only
    # the two stopped instances' root volumes bill.
    full_price = PRICES["p4d.24xlarge"]["on-demand"] + PRICES["p4d.24xlarge"]["spot"]
    assert spent_at_stop - budget <= full_price * SCHEDULE.total_seconds() / 3600
    stopped_hours = (minutes + 1 - stop_run) / 60
    assert world.spend() - spent_at_stop == pytest.approx(
        2 * root_volume_hourly(31) * stopped_hours
    )
    # Every interval was dated except the spot interruption: off by at most one run of it.
    assert worst_gap <= PRICES["p4d.24xlarge"]["spot"] * SCHEDULE.total_seconds() / 3600 + 1e-6
    assert sorted(subjects) == sorted(
        [f"{COST_TAG[1]}: spend passed {t:g}% of its budget" for t in THRESHOLDS]
        + [f"{COST_TAG[1]}: spend guard stopped 2 instance(s)"]
    )
    assert world.running_ids(tagged=False) == {stranger}
    # The ledger's marks tell what the stack had spent by any past instant (a run's start),
    # within the same one run of the interruption.
    for minute, spent in spent_by.items():
        instant = MONDAY + datetime.timedelta(minutes=minute)
        read_back = ledger.spent_by(instant, MONDAY.replace(day=1))
        assert spent - 1e-6 <= read_back <= spent + worst_gap + 1e-6, minute


def test_instances_started_after_the_stop_are_stopped_until_the_budget_is_raised(aws, topic):
    topic_arn, _ = topic
    world = World(aws["ec2"], MONDAY)
    node = world.launch()
    world.advance(hours=2)
    outcome = guard(aws, world, settings(topic_arn, 50.0))
    assert outcome.stopped_instances == (node,) and outcome.ledger.stopped
    world.advance(minutes=5)
    again = guard(aws, world, settings(topic_arn, 50.0))  # nothing runs: nothing to stop
    assert again.stopped_instances == () and again.notices == ()
    # Only the stopped instance's root volume adds to the spend.
    stored = 5 / 60 * root_volume_hourly(31)
    assert again.ledger.spent_usd == pytest.approx(outcome.ledger.spent_usd + stored)
    world.advance(minutes=3)
    world.start(node)  # someone starts it again
    world.advance(minutes=2)
    restarted = guard(aws, world, settings(topic_arn, 50.0))
    assert restarted.stopped_instances == (node,)
    assert restarted.ledger.spent_usd == pytest.approx(world.spend())
    world.advance(minutes=3)
    world.start(node)
    world.advance(minutes=2)
    raised = guard(aws, world, settings(topic_arn, 500.0))
    assert not raised.ledger.stopped and raised.stopped_instances == ()
    assert world.running_ids() == {node}
    assert raised.ledger.budget_usd == 500.0
    # Thresholds are of the new budget: none of them is passed yet, so each will notify again.
    assert raised.ledger.notified_thresholds == ()


def test_a_run_that_crashed_after_writing_the_ledger_is_not_counted_twice(aws, topic):
    topic_arn, queue = topic
    config = settings(topic_arn, 100.0)
    world = World(aws["ec2"], MONDAY)
    world.launch()
    guard(aws, world, config)
    world.advance(hours=1, minutes=40)  # past 50% of the budget: a notice is due

    class Crashing:
        def publish(self, **kwargs):
            raise ConnectionError("the function timed out while publishing")

    with pytest.raises(ConnectionError):
        guard(aws, world, config, sns=Crashing())
    written = read_ledger(aws["dynamodb"], "ledger", "2026-12")
    assert written.spent_usd == pytest.approx(world.spend())
    assert written.notified_thresholds == ()  # its notice never went out

    retried = guard(aws, world, config)  # the same instant again: no time to add
    assert retried.ledger.spent_usd == pytest.approx(world.spend())
    world.advance(minutes=5)
    later = guard(aws, world, config)
    assert later.ledger.spent_usd == pytest.approx(world.spend())
    assert later.ledger.notified_thresholds == (50.0,)
    assert notices(aws["sqs"], queue) == [f"{COST_TAG[1]}: spend passed 50% of its budget"]


def test_a_run_that_lost_the_race_for_the_ledger_accounts_again_on_top(aws, topic):
    topic_arn, _ = topic
    config = settings(topic_arn, 10_000.0)
    world = World(aws["ec2"], MONDAY)
    world.launch()
    world.advance(hours=1)

    class RacedDynamoDB:
        """Lets another run write first, right after this one read the ledger."""

        def __init__(self, real):
            self.real, self.raced = real, False

        def get_item(self, **kwargs):
            item = self.real.get_item(**kwargs)
            if not self.raced:
                self.raced = True
                run_guard(config, ec2=aws["ec2"], dynamodb=self.real, sns=aws["sns"], now=world.now)
            return item

        def put_item(self, **kwargs):
            return self.real.put_item(**kwargs)

    outcome = run_guard(
        config, ec2=aws["ec2"], dynamodb=RacedDynamoDB(aws["dynamodb"]), sns=aws["sns"],
        now=world.now,
    )  # fmt: skip
    assert outcome.ledger.spent_usd == pytest.approx(world.spend())
    assert outcome.ledger.version == 2


def test_an_instance_without_a_price_stops_the_stack_and_says_why(aws, topic):
    topic_arn, queue = topic
    world = World(aws["ec2"], MONDAY)
    priced, unpriced = world.launch(), world.launch("g5.xlarge")
    world.advance(minutes=30)
    outcome = guard(aws, world, settings(topic_arn, 10_000.0))
    assert set(outcome.stopped_instances) == {priced, unpriced}
    assert world.running_ids() == set()
    reason = outcome.ledger.stop_reason
    assert "no price in us-east-1 for g5.xlarge (on-demand" in reason and unpriced in reason
    # The priced instance is counted; the unpriced one is not passed off as free spend. Both
    # addresses and root volumes are priced.
    beside = 2 * (PUBLIC_IPV4_USD_PER_HOUR + root_volume_hourly(31))
    expected = 0.5 * (PRICES["p4d.24xlarge"]["on-demand"] + beside)
    assert outcome.ledger.spent_usd == pytest.approx(expected)
    assert notices(aws["sqs"], queue) == [f"{COST_TAG[1]}: spend guard stopped 2 instance(s)"]


def test_a_new_period_starts_a_new_ledger(aws, topic):
    topic_arn, _ = topic
    config = settings(topic_arn, 10_000.0)
    world = World(aws["ec2"], datetime.datetime(2026, 12, 31, 23, 0, tzinfo=datetime.UTC))
    world.launch()
    guard(aws, world, config)
    world.advance(hours=2)
    january = guard(aws, world, config).ledger
    assert january.period == "2027-01"
    hourly = PRICES["p4d.24xlarge"]["on-demand"] + PUBLIC_IPV4_USD_PER_HOUR
    assert january.spent_usd == pytest.approx(hourly + root_volume_hourly(31))  # one hour
    # December's last hour (23:00 to midnight) is counted in December, by January's first run.
    december = read_ledger(aws["dynamodb"], "ledger", "2026-12")
    assert december.spent_usd == pytest.approx(hourly + root_volume_hourly(31))
    assert december.accounted_until == "2027-01-01T00:00:00+00:00"
    assert read_ledger(aws["dynamodb"], "ledger", "2026-11") is None  # never written


# EC2's description of an instance, as DescribeInstances returns it, for the pure rules.
def described(state: str, launched: str, reason: str = "", lifecycle: str | None = None):
    instance = {
        "InstanceId": "i-1",
        "State": {"Name": state},
        "LaunchTime": datetime.datetime.fromisoformat(launched),
        "StateTransitionReason": reason,
    }
    if lifecycle:
        instance["InstanceLifecycle"] = lifecycle
    return instance


USER_STOP = "User initiated (2026-12-07 {} GMT)"
SINCE = datetime.datetime(2026, 12, 7, 10, 0, tzinfo=datetime.UTC)
NOW = SINCE + datetime.timedelta(minutes=5)


@pytest.mark.parametrize(
    ("instance", "was_running", "minutes"),
    [
        (described("running", "2026-12-07T08:00:00+00:00"), True, 5),
        (described("running", "2026-12-07T10:02:00+00:00"), False, 3),
        # restarted within the window: the gap before the restart counts (its stop is undated)
        (described("running", "2026-12-07T10:02:00+00:00"), True, 5),
        (
            described("stopped", "2026-12-07T08:00:00+00:00", USER_STOP.format("10:01:30")),
            True, 1.5,
        ),
        (described("terminated", "2026-12-07T08:00:00+00:00", "Service initiated"), True, 5),
        # an undated end of an instance not running at the window's start: counted before
        (described("terminated", "2026-12-07T08:00:00+00:00", "Service initiated"), False, 0),
        (described("pending", "2026-12-07T10:04:00+00:00"), False, 0),
        (
            described("stopped", "2026-12-07T08:00:00+00:00", USER_STOP.format("09:00:00")),
            False, 0,
        ),
    ],
)  # fmt: skip
def test_running_time_within_a_window(instance, was_running, minutes):
    assert running_hours(instance, SINCE, NOW, was_running=was_running) * 60 == pytest.approx(
        minutes
    )


def test_market_follows_the_instance_lifecycle():
    assert market(described("running", "2026-12-07T08:00:00+00:00")) == "on-demand"
    assert market(described("running", "2026-12-07T08:00:00+00:00", lifecycle="spot")) == "spot"
    block = described("running", "2026-12-07T08:00:00+00:00", lifecycle="capacity-block")
    assert market(block) == "capacity-block"


def test_the_lambda_entry_point_reads_its_environment_and_runs_on_the_real_clock(
    aws, topic, moto_endpoint, monkeypatch
):
    topic_arn, _ = topic
    for key, value in settings(topic_arn, 10_000.0).to_environment().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    world = World(aws["ec2"], datetime.datetime.now(datetime.UTC))
    node = world.launch()
    summary = handler({}, None)
    assert summary["period"] == datetime.datetime.now(datetime.UTC).strftime("%Y-%m")
    assert summary["stopped"] is False and summary["stopped_instances"] == []
    assert read_ledger(aws["dynamodb"], "ledger", summary["period"]).running == (node,)


def test_settings_travel_through_the_environment_and_a_broken_one_is_named():
    config = settings("arn:aws:sns:us-east-1:123456789012:alerts", 250.0)
    assert GuardSettings.from_environment(config.to_environment()) == config
    broken = {**config.to_environment(), "COST_TAG": "gpu-stack"}
    with pytest.raises(SettingsError, match="COST_TAG 'gpu-stack' is not KEY=VALUE"):
        GuardSettings.from_environment(broken)
    with pytest.raises(SettingsError, match="lacks LEDGER_TABLE"):
        GuardSettings.from_environment({})
    # The region's EBS and public IPv4 rates come with the prices: none is assumed.
    without_ebs = {k: v for k, v in config.to_environment().items() if k != "EBS_USD_PER_GB_MONTH"}
    with pytest.raises(SettingsError, match="lacks EBS_USD_PER_GB_MONTH"):
        GuardSettings.from_environment(without_ebs)
    free_address = {**config.to_environment(), "PUBLIC_IPV4_USD_PER_HOUR": "0"}
    with pytest.raises(SettingsError, match=r"public IPv4 price 0\.0 is invalid"):
        GuardSettings.from_environment(free_address)


def test_an_instance_ec2_will_not_stop_does_not_keep_the_others_running(aws, topic):
    topic_arn, queue = topic
    world = World(aws["ec2"], MONDAY)
    stubborn, other = world.launch(), world.launch()

    class Refusing:
        """EC2 refusing the stop of one instance, as for a one-time spot instance."""

        def __getattr__(self, name):
            return getattr(aws["ec2"], name)

        def stop_instances(self, InstanceIds):
            if stubborn in InstanceIds:
                error = {"Error": {"Code": "UnsupportedOperation", "Message": "one-time spot"}}
                raise ClientError(error, "StopInstances")
            return aws["ec2"].stop_instances(InstanceIds=InstanceIds)

    world.advance(hours=2)
    outcome = run_guard(
        settings(topic_arn, 50.0), ec2=Refusing(), dynamodb=aws["dynamodb"], sns=aws["sns"],
        now=world.now,
    )  # fmt: skip
    world.sync()
    assert outcome.stopped_instances == (other,)
    assert outcome.unstoppable == (f"{stubborn} (UnsupportedOperation)",)
    assert world.running_ids() == {stubborn}
    assert f"{COST_TAG[1]}: spend guard could not stop 1 instance(s)" in notices(aws["sqs"], queue)


def test_a_slurm_clusters_head_node_and_compute_node_are_priced_not_failed_safe(aws, topic):
    # The settings a cluster stack hands its function (the program under mocks), pointed at
    # this moto server's table and topic.
    run = run_stack(cluster="slurm", nodes=2)
    variables = one(run, "aws:lambda/function:Function").inputs["environment"]["variables"]
    topic_arn, queue = topic
    config = dataclasses.replace(
        GuardSettings.from_environment(variables), table="ledger", topic_arn=topic_arn
    )
    head = data_file_head_node("us-east-1")  # the mocks' region
    compute_type = run.outputs["instance_type"]
    world = World(aws["ec2"], MONDAY)
    head_node, compute_node = world.launch(head.instance_type), world.launch(compute_type)
    world.advance(minutes=30)
    outcome = guard(aws, world, config)
    assert not outcome.ledger.stopped and outcome.ledger.stop_reason == ""
    assert outcome.stopped_instances == ()
    assert world.running_ids() == {head_node, compute_node}
    compute_price = data_file_prices(compute_type).on_demand_usd_per_hour
    beside = 2 * (PUBLIC_IPV4_USD_PER_HOUR + root_volume_hourly(31))
    expected = 0.5 * (head.on_demand_usd_per_hour + compute_price + beside)
    assert outcome.ledger.spent_usd == pytest.approx(expected)
    assert notices(aws["sqs"], queue) == []
