import json
import math

import pulumi
import pulumi_aws as aws
import pytest

from infra.components.guardrails import Guardrails, GuardrailsArgs
from infra.config.guardrails import GuardrailConfig
from infra.dryrun.mocks import PLACEHOLDER_ACCOUNT as ACCOUNT
from infra.dryrun.mocks import PLACEHOLDER_REGION as REGION
from infra.dryrun.mocks import RecordingMocks
from infra.dryrun.runner import PROJECT
from infra.knowledge.profiles import resolve_profile
from infra.knowledge.resolver import resolve
from infra.node.agent import GPU_METRIC_NAMESPACE, GPU_UTILIZATION_METRIC
from tests.support.mock_runs import STACK, of_type, one, resolved, run_under_mocks
from tests.support.stack_runs import run_stack

PROFILES = ("l4x1", "l40sx4", "a100x8-80g", "a100x8")
EMAILS = ("ml@example.com", "ops@example.org")
COST_TAG = ("gpu-training-stack", f"{PROJECT}-{STACK}")
STOP_ARN = f"arn:aws:automate:{REGION}:ec2:stop"

BUDGET = "aws:budgets/budget:Budget"
ACTION = "aws:budgets/budgetAction:BudgetAction"
ALARM = "aws:cloudwatch/metricAlarm:MetricAlarm"
ROLE = "aws:iam/role:Role"
ROLE_POLICY = "aws:iam/rolePolicy:RolePolicy"
TOPIC = "aws:sns/topic:Topic"
TOPIC_POLICY = "aws:sns/topicPolicy:TopicPolicy"


def guarded_stack(plan, config):
    """Instances for every node of `plan`, and the guardrails around them:
    (mocks, the Guardrails component, the instance ids)."""

    def program():
        nodes = [
            aws.ec2.Instance(f"node-{rank}", instance_type=plan.instance.type, ami="ami-test")
            for rank in range(plan.nodes)
        ]
        instance_ids = [node.id for node in nodes]
        guardrails = Guardrails("gpu", GuardrailsArgs(config, COST_TAG))
        guardrails.watch(instance_ids)
        return guardrails, instance_ids

    mocks, (guardrails, instance_ids) = run_under_mocks(program)
    return mocks, guardrails, [resolved(instance_id) for instance_id in instance_ids]


def stop_alarms(recorded):
    """The alarms that stop an instance (idle, runtime): each watches one metric."""
    return [alarm for alarm in of_type(recorded, ALARM) if "metricQueries" not in alarm.inputs]


def silent_agent_alarms(recorded):
    return [alarm for alarm in of_type(recorded, ALARM) if "metricQueries" in alarm.inputs]


def budget_for(plan):
    return float(2 * math.ceil(plan.on_demand_usd_per_hour))


@pytest.mark.parametrize("profile", PROFILES)
def test_every_profile_gets_budget_action_and_idle_alarms(profile):
    plan = resolve_profile(profile)
    config = GuardrailConfig(budget_usd=budget_for(plan), alert_emails=EMAILS, idle_minutes=45)
    mocks, _, instance_ids = guarded_stack(plan, config)
    topic_arn = one(mocks, TOPIC).state["arn"]

    budget = one(mocks, BUDGET).inputs
    assert (budget["budgetType"], budget["limitUnit"], budget["timeUnit"]) == (
        "COST",
        "USD",
        "MONTHLY",
    )
    assert float(budget["limitAmount"]) == budget_for(plan)
    assert budget["costFilters"] == [
        {"name": "TagKeyValue", "values": [f"user:gpu-training-stack${PROJECT}-{STACK}"]}
    ]
    notifications = {(n["notificationType"], n["threshold"]) for n in budget["notifications"]}
    assert notifications == {("ACTUAL", 50), ("ACTUAL", 80), ("ACTUAL", 100), ("FORECASTED", 100)}
    for notification in budget["notifications"]:
        assert notification["comparisonOperator"] == "GREATER_THAN"
        assert notification["thresholdType"] == "PERCENTAGE"
        assert notification["subscriberEmailAddresses"] == list(EMAILS)
        assert notification["subscriberSnsTopicArns"] == [topic_arn]

    action = one(mocks, ACTION).inputs
    assert action["budgetName"] == budget["name"]
    assert action["actionType"] == "RUN_SSM_DOCUMENTS"
    assert action["approvalModel"] == "AUTOMATIC"
    assert action["notificationType"] == "ACTUAL"
    assert action["actionThreshold"] == {
        "actionThresholdType": "PERCENTAGE",
        "actionThresholdValue": 100,
    }
    assert action["definition"] == {
        "ssmActionDefinition": {
            "actionSubType": "STOP_EC2_INSTANCES",
            "instanceIds": instance_ids,
            "region": REGION,
        }
    }
    assert action["executionRoleArn"] == one(mocks, ROLE).state["arn"]
    assert {(s["subscriptionType"], s["address"]) for s in action["subscribers"]} == {
        ("EMAIL", EMAILS[0]),
        ("EMAIL", EMAILS[1]),
        ("SNS", topic_arn),
    }

    alarms = stop_alarms(mocks)
    assert len(alarms) == len(instance_ids) == plan.nodes
    assert [alarm.inputs["dimensions"] for alarm in alarms] == [
        {"InstanceId": instance_id} for instance_id in instance_ids
    ]
    for alarm in (alarm.inputs for alarm in alarms):
        assert (alarm["namespace"], alarm["metricName"]) == (
            GPU_METRIC_NAMESPACE,
            GPU_UTILIZATION_METRIC,
        )
        assert alarm["statistic"] == "Maximum"
        assert alarm["comparisonOperator"] == "LessThanThreshold"
        assert alarm["threshold"] == 5
        assert alarm["period"] * alarm["evaluationPeriods"] == 45 * 60
        assert alarm["datapointsToAlarm"] == alarm["evaluationPeriods"] == 9
        assert alarm["treatMissingData"] == "notBreaching"
        assert alarm["alarmActions"] == [STOP_ARN, topic_arn]


def test_execution_role_is_trusted_by_budgets_and_stops_only_these_instances():
    plan = resolve("p4d.24xlarge", nodes=3)
    config = GuardrailConfig(budget_usd=500, alert_emails=EMAILS)
    mocks, guardrails, instance_ids = guarded_stack(plan, config)

    trust = json.loads(one(mocks, ROLE).inputs["assumeRolePolicy"])
    (statement,) = trust["Statement"]
    assert statement["Principal"] == {"Service": "budgets.amazonaws.com"}
    assert statement["Action"] == "sts:AssumeRole"
    assert statement["Condition"] == {"StringEquals": {"aws:SourceAccount": ACCOUNT}}

    role_policy = one(mocks, ROLE_POLICY)
    assert role_policy.inputs["role"] == resolved(guardrails.budget_action_role.id)
    statements = {s["Sid"]: s for s in json.loads(role_policy.inputs["policy"])["Statement"]}
    assert statements["StopTheseInstances"]["Action"] == "ec2:StopInstances"
    assert statements["StopTheseInstances"]["Resource"] == [
        f"arn:aws:ec2:{REGION}:{ACCOUNT}:instance/{instance_id}" for instance_id in instance_ids
    ]
    assert statements["StartStopAutomation"]["Resource"] == (
        f"arn:aws:ssm:{REGION}:*:automation-definition/AWS-StopEC2Instance:*"
    )
    assert "*" not in json.dumps(statements["StopTheseInstances"]["Resource"])
    assert len(stop_alarms(mocks)) == 3


def test_topic_accepts_budget_and_alarm_notifications_of_this_account_only():
    plan = resolve_profile("l4x1")
    mocks, _, _ = guarded_stack(plan, GuardrailConfig(budget_usd=50, alert_emails=EMAILS))
    topic_arn = one(mocks, TOPIC).state["arn"]
    policy = one(mocks, TOPIC_POLICY).inputs
    assert policy["arn"] == topic_arn
    statements = json.loads(policy["policy"])["Statement"]
    assert {s["Principal"]["Service"] for s in statements} == {
        "budgets.amazonaws.com",
        "cloudwatch.amazonaws.com",
    }
    for statement in statements:
        assert (statement["Action"], statement["Resource"]) == ("SNS:Publish", topic_arn)
        assert statement["Condition"] == {"StringEquals": {"aws:SourceAccount": ACCOUNT}}


def test_max_runtime_adds_a_stop_alarm_per_instance():
    plan = resolve("p4d.24xlarge", nodes=2)
    config = GuardrailConfig(budget_usd=500, alert_emails=EMAILS, max_runtime_hours=72)
    mocks, _, instance_ids = guarded_stack(plan, config)
    runtime = [a.inputs for a in stop_alarms(mocks) if a.inputs["namespace"] == "AWS/EC2"]
    assert [alarm["dimensions"] for alarm in runtime] == [
        {"InstanceId": instance_id} for instance_id in instance_ids
    ]
    for alarm in runtime:
        assert (alarm["metricName"], alarm["statistic"]) == ("CPUUtilization", "SampleCount")
        assert alarm["comparisonOperator"] == "GreaterThanOrEqualToThreshold"
        assert alarm["threshold"] == 1
        assert (alarm["period"], alarm["evaluationPeriods"]) == (3600, 72)
        assert alarm["datapointsToAlarm"] == 72
        assert alarm["treatMissingData"] == "notBreaching"
        assert alarm["alarmActions"][0] == STOP_ARN


def test_no_runtime_alarm_without_a_maximum():
    plan = resolve_profile("a100x8")
    mocks, _, _ = guarded_stack(plan, GuardrailConfig(budget_usd=500, alert_emails=EMAILS))
    assert {alarm.inputs["namespace"] for alarm in stop_alarms(mocks)} == {GPU_METRIC_NAMESPACE}


def test_daily_budget_and_custom_thresholds_reach_the_budget():
    plan = resolve_profile("l4x1")
    config = GuardrailConfig(
        budget_usd=40,
        budget_period="DAILY",
        alert_emails=EMAILS[:1],
        actual_thresholds_percent=(90,),
        forecast_thresholds_percent=(),
    )
    mocks, _, _ = guarded_stack(plan, config)
    budget = one(mocks, BUDGET).inputs
    assert budget["timeUnit"] == "DAILY"
    assert budget["limitAmount"] == "40.00"
    assert [(n["notificationType"], n["threshold"]) for n in budget["notifications"]] == [
        ("ACTUAL", 90)
    ]


def test_without_alert_addresses_the_topic_is_the_only_subscriber():
    plan = resolve_profile("l4x1")
    mocks, _, _ = guarded_stack(plan, GuardrailConfig(budget_usd=50, allow_no_alerts=True))
    action = one(mocks, ACTION).inputs
    assert [s["subscriptionType"] for s in action["subscribers"]] == ["SNS"]
    for notification in one(mocks, BUDGET).inputs["notifications"]:
        assert "subscriberEmailAddresses" not in notification
        assert len(notification["subscriberSnsTopicArns"]) == 1


def test_costs_and_budget_name_are_outputs():
    plan = resolve_profile("a100x8")
    config = GuardrailConfig(budget_usd=500, alert_emails=EMAILS)
    _, guardrails, _ = guarded_stack(plan, config)
    assert resolved(guardrails.budget_name) == f"{PROJECT}-{STACK}"
    assert resolved(guardrails.alert_topic_arn).startswith(f"arn:aws:sns:{REGION}:")


def test_an_instance_type_not_allowed_is_refused_before_any_resource():
    mocks = RecordingMocks()
    with pytest.raises(
        pulumi.RunError, match=r"'p4d\.24xlarge' is not in gpu:allowedInstanceTypes"
    ):
        run_stack(mocks=mocks, profile="a100x8", allowedInstanceTypes=["p3.2xlarge"])
    assert mocks.resources == []


def test_budget_below_one_hour_allowed_with_the_override():
    plan = resolve_profile("a100x8")
    config = GuardrailConfig(budget_usd=20, alert_emails=EMAILS, allow_budget_below_one_hour=True)
    mocks, _, _ = guarded_stack(plan, config)
    assert one(mocks, BUDGET).inputs["limitAmount"] == "20.00"


def test_each_alert_address_subscribes_to_the_topic():
    plan = resolve_profile("l4x1")
    mocks, _, _ = guarded_stack(plan, GuardrailConfig(budget_usd=50, alert_emails=EMAILS))
    topic_arn = one(mocks, TOPIC).state["arn"]
    subscriptions = of_type(mocks, "aws:sns/topicSubscription:TopicSubscription")
    assert sorted((s.inputs["protocol"], s.inputs["endpoint"]) for s in subscriptions) == sorted(
        ("email", email) for email in EMAILS
    )
    assert {s.inputs["topic"] for s in subscriptions} == {topic_arn}


@pytest.mark.parametrize("spot", [False, True])
def test_every_node_waits_for_the_budget_and_the_alert_topic(spot):
    """A node that launches when its guardrails failed to create would run unwatched."""
    run = run_stack(spot=spot)
    (node,) = of_type(run, "aws:ec2/instance:Instance")
    waits = set(run.depends_on[f"{node.type} {node.name}"])
    budget, topic = one(run, BUDGET).name, one(run, TOPIC).name
    subscriptions = {s.name for s in of_type(run, "aws:sns/topicSubscription:TopicSubscription")}
    assert subscriptions and {budget, topic, *subscriptions} <= waits


def test_each_node_has_its_alarms_and_the_budget_action_stops_it():
    run = run_stack(maxRuntimeHours=8)
    (node,) = of_type(run, "aws:ec2/instance:Instance")
    alarms = stop_alarms(run)
    assert len(alarms) == 2
    assert all(alarm.inputs["dimensions"] == {"InstanceId": node.id} for alarm in alarms)
    definition = one(run, ACTION).inputs["definition"]["ssmActionDefinition"]
    assert definition["instanceIds"] == [node.id]


def test_a_running_node_without_gpu_metrics_notifies_and_is_not_stopped():
    """An agent that never reports would blind the idle alarm: someone hears of it."""
    plan = resolve("p4d.24xlarge", nodes=2)
    config = GuardrailConfig(budget_usd=500, alert_emails=EMAILS, idle_minutes=45)
    mocks, _, instance_ids = guarded_stack(plan, config)
    topic_arn = one(mocks, TOPIC).state["arn"]
    # One alarm per node, in whatever order Pulumi registered them (as their inputs resolve).
    alarms = {
        queries["running"]["metric"]["dimensions"]["InstanceId"]: (alarm.inputs, queries)
        for alarm in silent_agent_alarms(mocks)
        for queries in [{query["id"]: query for query in alarm.inputs["metricQueries"]}]
    }
    assert sorted(alarms) == sorted(instance_ids)
    for instance_id, (alarm, queries) in alarms.items():
        assert alarm["alarmActions"] == [topic_arn]  # a notification, never the stop action
        running, gpu = queries["running"]["metric"], queries["gpu"]["metric"]
        assert (running["namespace"], running["metricName"]) == ("AWS/EC2", "CPUUtilization")
        assert (gpu["namespace"], gpu["metricName"]) == (
            GPU_METRIC_NAMESPACE,
            GPU_UTILIZATION_METRIC,
        )
        assert gpu["dimensions"] == {"InstanceId": instance_id}
        assert queries["silent"]["expression"] == "IF(running > 0 AND FILL(gpu, 0) == 0, 1, 0)"
        assert [q["id"] for q in alarm["metricQueries"] if q.get("returnData")] == ["silent"]
        assert gpu["period"] * alarm["evaluationPeriods"] == 45 * 60
        assert alarm["treatMissingData"] == "notBreaching"  # stopped: no datapoint, no alarm
