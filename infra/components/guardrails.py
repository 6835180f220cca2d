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
from typing import TYPE_CHECKING, Any

import pulumi
import pulumi_aws as aws

from infra.config.guardrails import GUARDRAIL_KEYS, GuardrailConfig
from infra.knowledge.costs import cost_summary, hourly_usd
from infra.node.agent import (
    GPU_METRIC_DIMENSION,
    GPU_METRIC_NAMESPACE,
    GPU_UTILIZATION_METRIC,
    agent_policy_statement,
    cloudwatch_agent_config,
)

if TYPE_CHECKING:
    from infra.knowledge.resolver import Plan

__all__ = [
    "GPU_METRIC_DIMENSION",
    "GPU_METRIC_NAMESPACE",
    "GPU_UTILIZATION_METRIC",
    "GUARDRAIL_KEYS",
    "GuardrailConfig",
    "Guardrails",
    "agent_policy_statement",
    "cloudwatch_agent_config",
    "cost_summary",
]

STOP_AT_PERCENT = 100.0  # the budget action fires at 100% of actual spend
STOP_DOCUMENT = "AWS-StopEC2Instance"  # the AWS-owned SSM automation a STOP_EC2_INSTANCES runs
BUDGETS_PRINCIPAL = "budgets.amazonaws.com"
CLOUDWATCH_PRINCIPAL = "cloudwatch.amazonaws.com"


class Guardrails(pulumi.ComponentResource):
    """Budget, budget action, alert topic, and idle/runtime stop alarms for the given instances."""

    def __init__(
        self,
        name: str,
        config: GuardrailConfig,
        *,
        instance_ids: Sequence[pulumi.Input[str]],
        plan: Plan,
        cost_tag: tuple[str, str],
        spot: bool = False,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        """`cost_tag` is the (key, value) tag every resource of the stack carries; `spot` says
        which market the instances launch into (it sets the hourly cost the budget is held to).

        Raises ConfigError before creating anything when the budget would not buy one hour of
        the stack, when nobody would be alerted, or when the instance type is not allowed.
        """
        if not instance_ids:
            raise ValueError("Guardrails needs the ids of the instances it guards")
        config.check_instance_type(plan.instance.type)
        config.check_against(hourly_usd(plan, spot=spot))
        super().__init__("gpu:infra:Guardrails", name, None, opts)
        self.costs = cost_summary(plan, config, spot=spot)

        tag_key, tag_value = cost_tag
        tags = {tag_key: tag_value}
        child = pulumi.ResourceOptions(parent=self)
        lookup = pulumi.InvokeOutputOptions(parent=self)
        region = aws.get_region_output(opts=lookup).region
        caller = aws.get_caller_identity_output(opts=lookup)
        account = caller.account_id
        partition = caller.arn.apply(lambda arn: arn.split(":")[1])

        self.alert_topic = aws.sns.Topic(f"{name}-alerts", tags=tags, opts=child)
        topic_policy = aws.sns.TopicPolicy(
            f"{name}-alerts",
            arn=self.alert_topic.arn,
            policy=pulumi.Output.all(self.alert_topic.arn, account).apply(
                lambda args: json.dumps(_topic_policy(*args))
            ),
            opts=child,
        )

        self.budget = aws.budgets.Budget(
            f"{name}-budget",
            name=f"{pulumi.get_project()}-{pulumi.get_stack()}",
            budget_type="COST",
            limit_amount=f"{config.budget_usd:.2f}",
            limit_unit="USD",
            time_unit=config.budget_period,
            # Only counts once the tag is activated as a cost allocation tag (docs/costs.md).
            cost_filters=[
                aws.budgets.BudgetCostFilterArgs(
                    name="TagKeyValue", values=[f"user:{tag_key}${tag_value}"]
                )
            ],
            notifications=[
                *(
                    _notification("ACTUAL", threshold, config, self.alert_topic.arn)
                    for threshold in config.actual_thresholds_percent
                ),
                *(
                    _notification("FORECASTED", threshold, config, self.alert_topic.arn)
                    for threshold in config.forecast_thresholds_percent
                ),
            ],
            tags=tags,
            # Budgets must be allowed to publish before its first notification goes out.
            opts=pulumi.ResourceOptions(parent=self, depends_on=[topic_policy]),
        )

        self.budget_action_role = aws.iam.Role(
            f"{name}-budget-action",
            description="Lets AWS Budgets stop this stack's instances at the budget limit",
            assume_role_policy=account.apply(lambda acct: json.dumps(_budgets_trust(acct))),
            tags=tags,
            opts=child,
        )
        role_policy = aws.iam.RolePolicy(
            f"{name}-budget-action",
            role=self.budget_action_role.id,
            policy=pulumi.Output.all(partition, region, account, *instance_ids).apply(
                lambda args: json.dumps(_stop_instances_policy(*args[:3], args[3:]))
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
                    for email in config.alert_emails
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
        self.idle_alarms = [
            _idle_alarm(f"{name}-idle-{index}", instance_id, config, alarm_actions, tags, child)
            for index, instance_id in enumerate(instance_ids)
        ]
        self.runtime_alarms = [
            _runtime_alarm(
                f"{name}-max-runtime-{index}", instance_id, config, alarm_actions, tags, child
            )
            for index, instance_id in enumerate(instance_ids)
            if config.runtime_alarm_window is not None
        ]

        self.budget_name = self.budget.name
        self.alert_topic_arn = self.alert_topic.arn
        self.register_outputs(
            {
                "budgetName": self.budget_name,
                "alertTopicArn": self.alert_topic_arn,
                "budgetActionId": self.budget_action.action_id,
                "idleAlarmNames": [alarm.name for alarm in self.idle_alarms],
                "runtimeAlarmNames": [alarm.name for alarm in self.runtime_alarms],
                "onDemandUsdPerHour": self.costs["on_demand_usd_per_hour"],
                "spotUsdPerHour": self.costs["spot_usd_per_hour"],
                "hourlyUsd": self.costs["hourly_usd"],
                "monthlyBudgetUsd": self.costs["monthly_budget_usd"],
                "runwayHours": self.costs["runway_hours"],
            }
        )


def _notification(
    kind: str, threshold: float, config: GuardrailConfig, topic_arn: pulumi.Output[str]
) -> aws.budgets.BudgetNotificationArgs:
    return aws.budgets.BudgetNotificationArgs(
        notification_type=kind,
        comparison_operator="GREATER_THAN",
        threshold=threshold,
        threshold_type="PERCENTAGE",
        subscriber_email_addresses=list(config.alert_emails) or None,
        subscriber_sns_topic_arns=[topic_arn],
    )


def _idle_alarm(
    name: str,
    instance_id: pulumi.Input[str],
    config: GuardrailConfig,
    actions: list[pulumi.Output[str]],
    tags: dict[str, str],
    opts: pulumi.ResourceOptions,
) -> aws.cloudwatch.MetricAlarm:
    periods = config.idle_evaluation_periods
    return aws.cloudwatch.MetricAlarm(
        name,
        alarm_description=(
            f"Stops the instance when no GPU rose above {config.idle_gpu_percent:g}% "
            f"for {config.idle_minutes} minutes"
        ),
        namespace=GPU_METRIC_NAMESPACE,
        metric_name=GPU_UTILIZATION_METRIC,
        dimensions={GPU_METRIC_DIMENSION: instance_id},
        # Maximum over the instance's GPUs: one busy GPU (an evaluation, a single-GPU job)
        # keeps the instance running.
        statistic="Maximum",
        period=config.idle_period_seconds,
        evaluation_periods=periods,
        datapoints_to_alarm=periods,
        comparison_operator="LessThanThreshold",
        threshold=config.idle_gpu_percent,
        # No data means the agent is not publishing: the node is booting, pulling the image, or
        # stopped. Stopping it then would cut a boot short for no saving; the budget action and
        # the runtime alarm (EC2's own metric, no agent needed) still cover a silent agent.
        treat_missing_data="notBreaching",
        alarm_actions=actions,
        tags=tags,
        opts=opts,
    )


def _runtime_alarm(
    name: str,
    instance_id: pulumi.Input[str],
    config: GuardrailConfig,
    actions: list[pulumi.Output[str]],
    tags: dict[str, str],
    opts: pulumi.ResourceOptions,
) -> aws.cloudwatch.MetricAlarm:
    """Stops an instance that has run `max_runtime_hours` without a break.

    It counts EC2's own CPUUtilization datapoints, which exist exactly while the instance runs:
    every period with one breaches, and when all periods of the window breach, the instance has
    run the whole window. No agent, no extra role and no clock at deploy time: a restarted
    instance gets a fresh window, where a one-shot schedule fixed at `pulumi up` would not.
    """
    period, periods = config.runtime_alarm_window
    return aws.cloudwatch.MetricAlarm(
        name,
        alarm_description=f"Stops the instance after {config.max_runtime_hours:g} hours of running",
        namespace="AWS/EC2",
        metric_name="CPUUtilization",
        dimensions={"InstanceId": instance_id},
        statistic="SampleCount",
        period=period,
        evaluation_periods=periods,
        datapoints_to_alarm=periods,
        comparison_operator="GreaterThanOrEqualToThreshold",
        threshold=1,
        # A stopped instance publishes nothing: missing periods must not count as running, so a
        # stop (or a gap) restarts the window.
        treat_missing_data="notBreaching",
        alarm_actions=actions,
        tags=tags,
        opts=opts,
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


def _budgets_trust(account: str) -> dict[str, Any]:
    """Only AWS Budgets, acting for this account, may assume the action's role."""
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Principal": {"Service": BUDGETS_PRINCIPAL},
                "Action": "sts:AssumeRole",
                "Condition": {"StringEquals": {"aws:SourceAccount": account}},
            }
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
