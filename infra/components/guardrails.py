"""Cost guardrails for one stack: a budget that alerts and stops, and stops needing no billing data.

- An AWS Budget scoped to the stack's cost-allocation tag, notifying an SNS topic and the alert
  addresses at the configured actual/forecast thresholds.
- A budget action that stops the stack's instances at 100% of the budget (actual spend).
- Per instance, a CloudWatch alarm that stops it when its GPUs sit idle, and optionally one that
  stops it after a maximum runtime. AWS refreshes budget data only a few times a day, so these
  alarms are what catch an idle or forgotten instance within minutes.

The component looks up the region and account (aws:index/getRegion, getCallerIdentity) through
its own provider, so it follows a provider passed in `opts`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_aws as aws

from infra.components.iam import Account, service_role
from infra.config.guardrails import GuardrailConfig
from infra.node.agent import GPU_METRIC_DIMENSION, GPU_METRIC_NAMESPACE, GPU_UTILIZATION_METRIC

STOP_AT_PERCENT = 100.0  # the budget action fires at 100% of actual spend
STOP_DOCUMENT = "AWS-StopEC2Instance"  # the AWS-owned SSM automation a STOP_EC2_INSTANCES runs
BUDGETS_PRINCIPAL = "budgets.amazonaws.com"
CLOUDWATCH_PRINCIPAL = "cloudwatch.amazonaws.com"
BUDGET_ACTION_ROLE = "Lets AWS Budgets stop this stack's instances at the budget limit"


@dataclass(frozen=True)
class GuardrailsArgs:
    settings: GuardrailConfig  # the stack's guardrail settings, checked (infra.config.guardrails)
    cost_tag: tuple[str, str]  # (key, value) every resource of the stack carries


class Guardrails(pulumi.ComponentResource):
    """Alert topic and budget first; then, per instance it watches, the budget action and alarms.

    Build it before the instances and make them depend on `ready` (the topic, its policy and
    subscriptions, the budget): a node never runs without them. `watch(instance_ids)` adds the
    budget action and each instance's alarms, as soon as each instance exists.
    """

    def __init__(
        self,
        name: str,
        args: GuardrailsArgs,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("gpu:infra:Guardrails", name, None, opts)
        self._name, self._args = name, args
        self._tags = tags = dict([args.cost_tag])
        child = pulumi.ResourceOptions(parent=self)
        where = Account.of(self)
        self._partition, self._region = where.partition, where.region
        self._account = account = where.account_id

        self.alert_topic = aws.sns.Topic(f"{name}-alerts", tags=tags, opts=child)
        topic_policy = aws.sns.TopicPolicy(
            f"{name}-alerts",
            arn=self.alert_topic.arn,
            policy=pulumi.Output.all(self.alert_topic.arn, account).apply(
                lambda values: json.dumps(_topic_policy(*values))
            ),
            opts=child,
        )
        # A topic delivers nothing until someone subscribes; each address gets a confirmation
        # mail and receives alarms once it confirms (Amazon SNS Developer Guide, "Email
        # notifications": https://docs.aws.amazon.com/sns/latest/dg/sns-email-notifications.html).
        subscriptions = [
            aws.sns.TopicSubscription(
                f"{name}-alerts-{index}",
                topic=self.alert_topic.arn,
                protocol="email",
                endpoint=email,
                opts=child,
            )
            for index, email in enumerate(args.settings.alert_emails)
        ]

        self.budget = _budget(name, args, self.alert_topic.arn, topic_policy, tags, self)
        self.budget_action_role = service_role(
            f"{name}-budget-action", BUDGETS_PRINCIPAL, BUDGET_ACTION_ROLE, account, tags, child
        )
        # What the instances wait for: every way the stack reports and limits spend.
        self.ready: list[pulumi.Resource] = [
            self.alert_topic,
            topic_policy,
            *subscriptions,
            self.budget,
            self.budget_action_role,
        ]
        self.budget_name = self.budget.name
        self.alert_topic_arn = self.alert_topic.arn
        self.idle_alarms: list[aws.cloudwatch.MetricAlarm] = []
        self.runtime_alarms: list[aws.cloudwatch.MetricAlarm] = []

    def watch(self, instance_ids: Sequence[pulumi.Input[str]]) -> None:
        """The budget action that stops these instances, and each one's alarms."""
        if not instance_ids:
            raise ValueError("Guardrails needs the ids of the instances it guards")
        name, args, tags = self._name, self._args, self._tags
        partition, region, account = self._partition, self._region, self._account
        child = pulumi.ResourceOptions(parent=self)
        role_policy = aws.iam.RolePolicy(
            f"{name}-budget-action",
            role=self.budget_action_role.id,
            policy=pulumi.Output.all(partition, region, account, *instance_ids).apply(
                lambda values: json.dumps(_stop_instances_policy(*values[:3], values[3:]))
            ),
            opts=child,
        )
        self.budget_action = aws.budgets.BudgetAction(
            f"{name}-stop-at-limit",
            budget_name=self.budget.name,
            action_type="RUN_SSM_DOCUMENTS",
            approval_model="AUTOMATIC",
            notification_type="ACTUAL",
            action_threshold=aws.budgets.BudgetActionActionThresholdArgs(
                action_threshold_type="PERCENTAGE", action_threshold_value=STOP_AT_PERCENT
            ),
            definition=aws.budgets.BudgetActionDefinitionArgs(
                ssm_action_definition=aws.budgets.BudgetActionDefinitionSsmActionDefinitionArgs(
                    action_sub_type="STOP_EC2_INSTANCES",
                    instance_ids=list(instance_ids),
                    region=region,
                )
            ),
            execution_role_arn=self.budget_action_role.arn,
            subscribers=[
                *(
                    aws.budgets.BudgetActionSubscriberArgs(address=email, subscription_type="EMAIL")
                    for email in args.settings.alert_emails
                ),
                aws.budgets.BudgetActionSubscriberArgs(
                    address=self.alert_topic.arn, subscription_type="SNS"
                ),
            ],
            tags=tags,
            # The role must be able to stop the instances before the action can fire.
            opts=pulumi.ResourceOptions(parent=self, depends_on=[role_policy]),
        )

        stop_action = pulumi.Output.concat("arn:", partition, ":automate:", region, ":ec2:stop")
        alarm_actions = [stop_action, self.alert_topic.arn]
        stopping = [_AlarmTarget(node, alarm_actions, tags, child) for node in instance_ids]
        # Missing GPU metrics on a running node notify, and never stop it.
        notifying = [
            _AlarmTarget(node, [self.alert_topic.arn], tags, child) for node in instance_ids
        ]
        self.idle_alarms = [
            _idle_alarm(f"{name}-idle-{index}", args.settings, target)
            for index, target in enumerate(stopping)
        ]
        self.silent_agent_alarms = [
            _silent_agent_alarm(f"{name}-no-gpu-metrics-{index}", args.settings, target)
            for index, target in enumerate(notifying)
        ]
        self.runtime_alarms = [
            _runtime_alarm(f"{name}-max-runtime-{index}", args.settings, target)
            for index, target in enumerate(stopping)
            if args.settings.runtime_alarm_window is not None
        ]

        self.register_outputs(
            {
                "budgetName": self.budget_name,
                "alertTopicArn": self.alert_topic_arn,
                "budgetActionId": self.budget_action.action_id,
                "idleAlarmNames": [alarm.name for alarm in self.idle_alarms],
                "runtimeAlarmNames": [alarm.name for alarm in self.runtime_alarms],
                "silentAgentAlarmNames": [alarm.name for alarm in self.silent_agent_alarms],
            }
        )


def _budget(
    name: str,
    args: GuardrailsArgs,
    topic_arn: pulumi.Output[str],
    topic_policy: aws.sns.TopicPolicy,
    tags: dict[str, str],
    component: Guardrails,
) -> aws.budgets.Budget:
    """The stack's budget, scoped to its cost tag, notifying at each threshold."""
    tag_key, tag_value = args.cost_tag
    return aws.budgets.Budget(
        f"{name}-budget",
        name=f"{pulumi.get_project()}-{pulumi.get_stack()}",
        budget_type="COST",
        limit_amount=f"{args.settings.budget_usd:.2f}",
        limit_unit="USD",
        time_unit=args.settings.budget_period,
        # Only counts once the tag is activated as a cost allocation tag (docs/costs.md).
        cost_filters=[
            aws.budgets.BudgetCostFilterArgs(
                name="TagKeyValue", values=[f"user:{tag_key}${tag_value}"]
            )
        ],
        notifications=[
            *(
                _notification("ACTUAL", threshold, args, topic_arn)
                for threshold in args.settings.actual_thresholds_percent
            ),
            *(
                _notification("FORECASTED", threshold, args, topic_arn)
                for threshold in args.settings.forecast_thresholds_percent
            ),
        ],
        tags=tags,
        # Budgets must be allowed to publish before its first notification goes out.
        opts=pulumi.ResourceOptions(parent=component, depends_on=[topic_policy]),
    )


def _notification(
    kind: str, threshold: float, args: GuardrailsArgs, topic_arn: pulumi.Output[str]
) -> aws.budgets.BudgetNotificationArgs:
    return aws.budgets.BudgetNotificationArgs(
        notification_type=kind,
        comparison_operator="GREATER_THAN",
        threshold=threshold,
        threshold_type="PERCENTAGE",
        subscriber_email_addresses=list(args.settings.alert_emails) or None,
        subscriber_sns_topic_arns=[topic_arn],
    )


@dataclass(frozen=True)
class _AlarmTarget:
    """The node an alarm watches, and what the alarm does and carries."""

    instance_id: pulumi.Input[str]
    actions: list[pulumi.Output[str]]
    tags: dict[str, str]
    opts: pulumi.ResourceOptions


def _whole_window(periods: int, target: _AlarmTarget) -> dict[str, Any]:
    """A node alarm's common settings: it fires only when every one of `periods` breaches,
    and a period with no datapoint never breaches."""
    return {
        "evaluation_periods": periods,
        "datapoints_to_alarm": periods,
        "treat_missing_data": "notBreaching",
        "alarm_actions": target.actions,
        "tags": target.tags,
        "opts": target.opts,
    }


def _idle_alarm(
    name: str, settings: GuardrailConfig, target: _AlarmTarget
) -> aws.cloudwatch.MetricAlarm:
    periods = settings.idle_evaluation_periods
    return aws.cloudwatch.MetricAlarm(
        name,
        alarm_description=(
            f"Stops the instance when no GPU rose above {settings.idle_gpu_percent:g}% "
            f"for {settings.idle_minutes} minutes"
        ),
        namespace=GPU_METRIC_NAMESPACE,
        metric_name=GPU_UTILIZATION_METRIC,
        dimensions={GPU_METRIC_DIMENSION: target.instance_id},
        # Maximum over the instance's GPUs: one busy GPU (an evaluation, a single-GPU job)
        # keeps the instance running.
        statistic="Maximum",
        period=settings.idle_period_seconds,
        comparison_operator="LessThanThreshold",
        threshold=settings.idle_gpu_percent,
        # No data means the agent is not publishing: the node is booting, syncing data, pulling
        # the image (the boot publishes only while the job runs), or stopped. Stopping it then
        # would cut a boot short for no saving; the no-GPU-metrics alarm notifies instead, and
        # the budget action and the runtime alarm (EC2's own metric) still cover the node.
        **_whole_window(periods, target),
    )


def _silent_agent_alarm(
    name: str, settings: GuardrailConfig, target: _AlarmTarget
) -> aws.cloudwatch.MetricAlarm:
    """Notifies (never stops) when a running node has published no GPU metric for as long as
    the idle alarm looks back: the job has not started (data sync, image not pushed yet) or the
    agent is down, and the idle alarm cannot see the node.

    "Running" is EC2's own CPUUtilization, which has datapoints exactly while the instance
    runs; FILL turns the missing GPU series into 0 so that the expression is 1 where the node
    runs silent, and has no datapoint where it is stopped (CloudWatch User Guide, "Using metric
    math": IF, FILL, https://docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/using-metric-math.html).
    """
    period, periods = settings.idle_period_seconds, settings.idle_evaluation_periods
    return aws.cloudwatch.MetricAlarm(
        name,
        alarm_description=(
            f"The instance has run {settings.idle_minutes} minutes without GPU metrics: its job "
            "has not started (data sync, image not pushed yet) or the CloudWatch agent is down"
        ),
        metric_queries=[
            {
                "id": "running",
                "metric": {
                    "namespace": "AWS/EC2",
                    "metric_name": "CPUUtilization",
                    "dimensions": {"InstanceId": target.instance_id},
                    "stat": "SampleCount",
                    "period": period,
                },
                "return_data": False,
            },
            {
                "id": "gpu",
                "metric": {
                    "namespace": GPU_METRIC_NAMESPACE,
                    "metric_name": GPU_UTILIZATION_METRIC,
                    "dimensions": {GPU_METRIC_DIMENSION: target.instance_id},
                    "stat": "SampleCount",
                    "period": period,
                },
                "return_data": False,
            },
            {
                "id": "silent",
                "expression": "IF(running > 0 AND FILL(gpu, 0) == 0, 1, 0)",
                "label": "running without GPU metrics",
                "return_data": True,
            },
        ],
        comparison_operator="GreaterThanOrEqualToThreshold",
        threshold=1,
        # A stopped node has no datapoint at all: not a problem.
        **_whole_window(periods, target),
    )


def _runtime_alarm(
    name: str, settings: GuardrailConfig, target: _AlarmTarget
) -> aws.cloudwatch.MetricAlarm:
    """Stops an instance that has run `max_runtime_hours` without a break.

    It counts EC2's own CPUUtilization datapoints, which exist exactly while the instance runs:
    every period with one breaches, and when all periods of the window breach, the instance has
    run the whole window. No agent, no extra role and no clock at deploy time: a restarted
    instance gets a fresh window, where a one-shot schedule fixed at `pulumi up` would not.
    """
    period, periods = settings.runtime_alarm_window
    return aws.cloudwatch.MetricAlarm(
        name,
        alarm_description=(
            f"Stops the instance after {settings.max_runtime_hours:g} hours of running"
        ),
        namespace="AWS/EC2",
        metric_name="CPUUtilization",
        dimensions={"InstanceId": target.instance_id},
        statistic="SampleCount",
        period=period,
        comparison_operator="GreaterThanOrEqualToThreshold",
        threshold=1,
        # A stopped instance publishes nothing: missing periods must not count as running, so a
        # stop (or a gap) restarts the window.
        **_whole_window(periods, target),
    )


def _topic_policy(topic_arn: str, account: str) -> dict[str, Any]:
    """Budgets and CloudWatch alarms of this account may publish to the alert topic."""
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": sid,
                "Effect": "Allow",
                "Principal": {"Service": service},
                "Action": "SNS:Publish",
                "Resource": topic_arn,
                "Condition": {"StringEquals": {"aws:SourceAccount": account}},
            }
            for sid, service in (
                ("BudgetsPublish", BUDGETS_PRINCIPAL),
                ("CloudWatchAlarmsPublish", CLOUDWATCH_PRINCIPAL),
            )
        ],
    }


def _stop_instances_policy(
    partition: str, region: str, account: str, instance_ids: Sequence[str]
) -> dict[str, Any]:
    """What STOP_EC2_INSTANCES needs, and no more: start the AWS-owned stop automation, which
    then (through SSM) may stop these instances only and read instance status (a Describe call
    has no resource-level permissions).
    """
    through_ssm = {"ForAnyValue:StringEquals": {"aws:CalledVia": ["ssm.amazonaws.com"]}}
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "StartStopAutomation",
                "Effect": "Allow",
                "Action": "ssm:StartAutomationExecution",
                # AWS-owned documents carry no account in their ARN: the wildcard matches it.
                "Resource": (
                    f"arn:{partition}:ssm:{region}:*:automation-definition/{STOP_DOCUMENT}:*"
                ),
            },
            {
                "Sid": "StopTheseInstances",
                "Effect": "Allow",
                "Action": "ec2:StopInstances",
                "Resource": [
                    f"arn:{partition}:ec2:{region}:{account}:instance/{instance_id}"
                    for instance_id in instance_ids
                ],
                "Condition": through_ssm,
            },
            {
                "Sid": "ReadInstanceStatus",
                "Effect": "Allow",
                "Action": "ec2:DescribeInstanceStatus",
                "Resource": "*",
                "Condition": through_ssm,
            },
        ],
    }
