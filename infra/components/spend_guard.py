"""The spend guard around one stack: its ledger table, its function, its role and its schedule.

The function (infra/functions/spend_guard.py) runs every SPEND_GUARD_PERIOD_MINUTES, counts the
running time of every instance carrying the stack's cost tag at the prices of the stack's region
(its volumes and public addresses at that region's rates), keeps the period's spend in the ledger
table, notifies the alert topic at each threshold and stops the stack's instances at the budget.
Billing data plays no part, so it acts within minutes where AWS Budgets acts within hours.

AWS behaviour the resources rely on (mocks accept anything):
- Lambda's Python runtimes include boto3, so the code ships as a plain archive of
  infra/functions/ ("Lambda runtimes", docs.aws.amazon.com/lambda/latest/dg/lambda-runtimes.html).
- ec2:StopInstances and ec2:TerminateInstances honour `aws:ResourceTag/<key>`; the Describe
  actions take no resource-level permission, only "*" ("Actions, resources, and condition keys
  for Amazon EC2", docs.aws.amazon.com/service-authorization/latest/reference/
  list_amazonec2.html).
- dynamodb:UpdateItem on a table is what changing one item of it takes ("Actions, resources,
  and condition keys for Amazon DynamoDB", docs.aws.amazon.com/service-authorization/latest/
  reference/list_amazondynamodb.html): the cluster's fleet item, in ParallelCluster's table.
- EventBridge Scheduler invokes a Lambda target as a role it may assume, which needs
  lambda:InvokeFunction ("Set up the execution role", docs.aws.amazon.com/scheduler/latest/
  UserGuide/setting-up.html#setting-up-execution-role).
- The alert topic's policy names only AWS services; the function publishes as an identity of the
  same account, which its own IAM policy allows (same-account access needs either policy:
  "Policy evaluation logic", docs.aws.amazon.com/IAM/latest/UserGuide/
  reference_policies_evaluation-logic.html).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pulumi
import pulumi_aws as aws

from infra.cluster.config import QUEUE
from infra.components.iam import Account, service_role
from infra.config.guardrails import GuardrailConfig
from infra.functions import fleet
from infra.functions.ledger import PERIOD_KEY
from infra.functions.settings import GuardSettings
from infra.knowledge.catalog import load_catalog
from infra.knowledge.costs import SPEND_GUARD_PERIOD_MINUTES, spend_guard_timeout_s
from infra.knowledge.parallelcluster import HeadNode, load_parallelcluster
from infra.knowledge.resolver import Plan

FUNCTIONS_DIR = Path(__file__).resolve().parents[1] / "functions"
COMMON_DIR = Path(__file__).resolve().parents[2] / "common"
# The modules of common/ the guard imports (standard library only): the archive carries them.
LAMBDA_SHARED = ("market",)
HANDLER = "infra.functions.spend_guard.handler"
RUNTIME = "python3.12"
LOG_RETENTION_DAYS = 30
LAMBDA_PRINCIPAL = "lambda.amazonaws.com"
SCHEDULER_PRINCIPAL = "scheduler.amazonaws.com"
GUARD_ROLE = "Lets the spend guard read EC2, keep its ledger, alert and stop the stack"
SCHEDULE_ROLE = "Lets EventBridge Scheduler run the spend guard"


@dataclass(frozen=True)
class SpendGuardArgs:
    plan: Plan  # its region picks the prices the function counts with
    guardrails: GuardrailConfig  # budget, period and alert thresholds
    cost_tag: tuple[str, str]  # (key, value) on every instance of the stack
    alert_topic_arn: pulumi.Input[str]
    # A Slurm cluster's head node: on demand, a type outside the GPU catalog, so priced for the
    # plan's region from infra/knowledge/data/parallelcluster.toml (without it the guard would
    # fail safe).
    head_node: HeadNode | None = None
    # The ParallelCluster cluster's name, on a cluster stack: the guard stops its compute fleet.
    cluster_name: str = ""
    capacity_block_id: str = ""  # the guard counts the block's fee and never stops it


class SpendGuard(pulumi.ComponentResource):
    """A ledger of the stack's EC2 spend, kept every few minutes, that stops it at the budget."""

    def __init__(
        self, name: str, args: SpendGuardArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("gpu:infra:SpendGuard", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        where = Account.of(self)
        partition, region, account = where.partition, where.region, where.account_id
        tags = dict([args.cost_tag])

        self.ledger = aws.dynamodb.Table(
            f"{name}-spend-ledger",
            billing_mode="PAY_PER_REQUEST",
            hash_key=PERIOD_KEY,
            attributes=[aws.dynamodb.TableAttributeArgs(name=PERIOD_KEY, type="S")],
            point_in_time_recovery=aws.dynamodb.TablePointInTimeRecoveryArgs(enabled=True),
            tags=tags,
            opts=child,
        )
        log_group = aws.cloudwatch.LogGroup(
            f"{name}-spend-guard", retention_in_days=LOG_RETENTION_DAYS, tags=tags, opts=child
        )
        role = service_role(
            f"{name}-spend-guard", LAMBDA_PRINCIPAL, GUARD_ROLE, account, tags, child
        )
        role_policy = aws.iam.RolePolicy(
            f"{name}-spend-guard",
            role=role.id,
            policy=pulumi.Output.all(
                partition, region, account, self.ledger.arn, args.alert_topic_arn, log_group.arn
            ).apply(
                lambda values: json.dumps(
                    guard_policy(
                        *values,
                        cost_tag=args.cost_tag,
                        cluster_name=args.cluster_name,
                        capacity_block=bool(args.capacity_block_id),
                    )
                )
            ),
            opts=child,
        )
        environment = _environment(args, self.ledger.name)
        self.function = aws.lambda_.Function(
            f"{name}-spend-guard",
            description="Counts the stack's EC2 spend and stops it at the budget",
            runtime=RUNTIME,
            handler=HANDLER,
            code=function_archive(),
            role=role.arn,
            # A cluster's run may first hold its jobs (infra/functions/spend_guard.py).
            timeout=spend_guard_timeout_s(bool(args.cluster_name)),
            memory_size=256,
            environment=aws.lambda_.FunctionEnvironmentArgs(variables=environment),
            logging_config=aws.lambda_.FunctionLoggingConfigArgs(
                log_format="Text", log_group=log_group.name
            ),
            tags=tags,
            # Its first run must be able to read, write and stop.
            opts=pulumi.ResourceOptions(parent=self, depends_on=[role_policy]),
        )
        self.schedule = _schedule(self, name, self.function.arn, account, tags)

        self.ledger_table_name = self.ledger.name
        self.register_outputs(
            {
                "ledgerTableName": self.ledger.name,
                "functionName": self.function.name,
                "scheduleName": self.schedule.name,
            }
        )


def _schedule(
    guard: SpendGuard,
    name: str,
    function_arn: pulumi.Output[str],
    account: pulumi.Output[str],
    tags: dict[str, str],
) -> aws.scheduler.Schedule:
    """EventBridge Scheduler runs the guard every period, through a role that may only invoke it."""
    child = pulumi.ResourceOptions(parent=guard)
    schedule_role = service_role(
        f"{name}-spend-guard-schedule", SCHEDULER_PRINCIPAL, SCHEDULE_ROLE, account, tags, child
    )
    schedule_policy = aws.iam.RolePolicy(
        f"{name}-spend-guard-schedule",
        role=schedule_role.id,
        policy=function_arn.apply(
            lambda arn: json.dumps(
                {
                    "Version": "2012-10-17",
                    "Statement": [
                        {"Effect": "Allow", "Action": "lambda:InvokeFunction", "Resource": arn}
                    ],
                }
            )
        ),
        opts=child,
    )
    return aws.scheduler.Schedule(
        f"{name}-spend-guard",
        description=f"Runs the spend guard every {SPEND_GUARD_PERIOD_MINUTES} minutes",
        schedule_expression=f"rate({SPEND_GUARD_PERIOD_MINUTES} minutes)",
        flexible_time_window=aws.scheduler.ScheduleFlexibleTimeWindowArgs(mode="OFF"),
        target=aws.scheduler.ScheduleTargetArgs(
            arn=function_arn,
            role_arn=schedule_role.arn,
            # A run older than one period is superseded by the next one.
            retry_policy=aws.scheduler.ScheduleTargetRetryPolicyArgs(
                maximum_event_age_in_seconds=SPEND_GUARD_PERIOD_MINUTES * 60,
                maximum_retry_attempts=2,
            ),
        ),
        opts=pulumi.ResourceOptions(parent=guard, depends_on=[schedule_policy]),
    )


def _environment(args: SpendGuardArgs, ledger_name: pulumi.Output[str]) -> pulumi.Output[dict]:
    """The guard's settings (infra/functions/settings.py) as its Lambda environment, with the
    price of every instance type it may find carrying the stack's tag, and the EBS and public
    IPv4 rates, all of the stack's region."""
    price_table = load_catalog().prices
    prices = {
        instance_type: price.by_market()
        for instance_type, price in price_table.region(args.plan.price.region).items()
    }
    volumes_and_addresses = price_table.volumes_and_addresses(args.plan.price.region)
    if args.head_node is not None:
        head_node = args.head_node.price_in(args.plan.price.region)
        prices[args.head_node.instance_type] = {"on-demand": head_node.on_demand_usd_per_hour}
    # A cluster's NAT gateway, priced as its idle cost is (infra/knowledge/parallelcluster.py).
    nat_gateway = (
        load_parallelcluster().network.price_in(args.plan.price.region).nat_gateway_usd_per_hour
        if args.cluster_name
        else 0.0
    )
    return pulumi.Output.all(ledger_name, args.alert_topic_arn).apply(
        lambda values: GuardSettings(
            table=values[0],
            topic_arn=values[1],
            cost_tag=args.cost_tag,
            budget_usd=args.guardrails.budget_usd,
            budget_period=args.guardrails.budget_period,
            thresholds_percent=args.guardrails.actual_thresholds_percent,
            region=args.plan.price.region,
            prices=prices,
            ebs_usd_per_gb_month=volumes_and_addresses.ebs_usd_per_gb_month,
            public_ipv4_usd_per_hour=volumes_and_addresses.public_ipv4_usd_per_hour,
            cluster_name=args.cluster_name,
            cluster_queue=QUEUE if args.cluster_name else "",
            capacity_block_id=args.capacity_block_id,
            nat_gateway_usd_per_hour=nat_gateway,
        ).to_environment()
    )


def function_archive() -> pulumi.AssetArchive:
    """infra/functions/ under its package path, so the handler imports as it does here, and
    the shared modules it imports (LAMBDA_SHARED)."""
    return pulumi.AssetArchive(
        {
            "infra/__init__.py": pulumi.StringAsset(""),
            "infra/functions": pulumi.FileArchive(str(FUNCTIONS_DIR)),
            "common/__init__.py": pulumi.StringAsset(""),
            **{
                f"common/{name}.py": pulumi.FileAsset(str(COMMON_DIR / f"{name}.py"))
                for name in LAMBDA_SHARED
            },
        }
    )


def guard_policy(
    partition: str,
    region: str,
    account: str,
    table_arn: str,
    topic_arn: str,
    log_group_arn: str,
    *,
    cost_tag: tuple[str, str],
    cluster_name: str = "",
    capacity_block: bool = False,
) -> dict[str, Any]:
    """Stop or end only instances carrying the stack's tag; read EC2; its own table, topic
    and logs; on a cluster, its compute fleet's status item."""
    tag_key, tag_value = cost_tag
    instances = f"arn:{partition}:ec2:{region}:{account}:instance/*"
    the_stacks = {"StringEquals": {f"aws:ResourceTag/{tag_key}": tag_value}}
    # Instances, their spot prices, and the volumes and NAT gateways that bill beside them.
    reads = [
        "ec2:DescribeInstances",
        "ec2:DescribeSpotPriceHistory",
        "ec2:DescribeVolumes",
        "ec2:DescribeNatGateways",
    ]
    # A block's dates and size (the fee counted up front); Describe takes only "*".
    reads += ["ec2:DescribeCapacityReservations"] if capacity_block else []
    cluster = (
        [
            {
                "Sid": "StopTheClustersComputeFleet",
                "Effect": "Allow",
                "Action": "dynamodb:UpdateItem",
                "Resource": (
                    f"arn:{partition}:dynamodb:{region}:{account}:table/"
                    f"{fleet.TABLE_PREFIX}{cluster_name}"
                ),
            },
            # Hold the jobs on the head node before the stop: Run Command's SendCommand on
            # the stack's instances (by tag) with AWS's shell-script document, and reading
            # the command's result, which takes no resource ("Actions, resources, and
            # condition keys for AWS Systems Manager": SendCommand, instance and document,
            # ssm:resourceTag/${TagKey}; GetCommandInvocation, "*").
            {
                "Sid": "HoldTheClustersJobs",
                "Effect": "Allow",
                "Action": "ssm:SendCommand",
                "Resource": instances,
                "Condition": {"StringEquals": {f"ssm:resourceTag/{tag_key}": tag_value}},
            },
            {
                "Sid": "WithTheShellScriptDocument",
                "Effect": "Allow",
                "Action": "ssm:SendCommand",
                "Resource": f"arn:{partition}:ssm:{region}::document/AWS-RunShellScript",
            },
            {
                "Sid": "ReadTheHoldsResult",
                "Effect": "Allow",
                "Action": "ssm:GetCommandInvocation",
                "Resource": "*",
            },
        ]
        if cluster_name
        else []
    )
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "StopTheStacksInstances",
                "Effect": "Allow",
                "Action": "ec2:StopInstances",
                "Resource": instances,
                "Condition": the_stacks,
            },
            # A cluster's compute nodes, and spot instances EC2 will not stop (one-time).
            {
                "Sid": "TerminateTheStacksInstances",
                "Effect": "Allow",
                "Action": "ec2:TerminateInstances",
                "Resource": instances,
                "Condition": the_stacks,
            },
            {
                "Sid": "ReadInstancesAndSpotPrices",
                "Effect": "Allow",
                "Action": reads,
                "Resource": "*",
            },
            *cluster,
            {
                "Sid": "KeepTheLedger",
                "Effect": "Allow",
                "Action": ["dynamodb:GetItem", "dynamodb:PutItem"],
                "Resource": table_arn,
            },
            {
                "Sid": "Alert",
                "Effect": "Allow",
                "Action": "sns:Publish",
                "Resource": topic_arn,
            },
            {
                "Sid": "WriteItsLogs",
                "Effect": "Allow",
                "Action": ["logs:CreateLogStream", "logs:PutLogEvents"],
                "Resource": f"{log_group_arn}:*",
            },
        ],
    }
