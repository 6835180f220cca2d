"""The SpendGuard component under mocks, in the real program, for every profile."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tomllib

import pulumi
import pytest

from infra.components.spend_guard import FUNCTIONS_DIR, function_archive
from infra.functions.settings import GuardSettings
from infra.knowledge.parallelcluster import PARALLELCLUSTER_PATH
from infra.knowledge.profiles import load_profiles
from tests.support.infra import data_file_head_node, data_file_prices
from tests.support.mock_runs import of_type, one
from tests.support.stack_runs import BASE_CONFIG, ROLE_POLICY, run_stack

FUNCTION = "aws:lambda/function:Function"
SCHEDULE = "aws:scheduler/schedule:Schedule"
TABLE = "aws:dynamodb/table:Table"
TOPIC = "aws:sns/topic:Topic"
ROLE = "aws:iam/role:Role"
SUBSCRIPTION = "aws:sns/topicSubscription:TopicSubscription"
BUDGET = "aws:budgets/budget:Budget"
STACK = "aws:cloudformation/stack:Stack"
COST_TAG = ("gpu-stack", "gpu-training-stack-test")
LAMBDA_ENVIRONMENT_BYTES = 4096  # Lambda quotas: 4 KB of environment variables


def policy(run, suffix: str) -> dict:
    (found,) = [r for r in of_type(run, ROLE_POLICY) if r.name.endswith(suffix)]
    return json.loads(found.inputs["policy"])


@pytest.fixture(scope="module", params=sorted(load_profiles().profiles))
def profile_run(request):
    return request.param, run_stack(profile=request.param)


def test_the_function_counts_with_the_stacks_budget_tag_and_regional_prices(profile_run):
    _, run = profile_run
    function = one(run, FUNCTION).inputs
    assert (function["runtime"], function["handler"]) == (
        "python3.12",
        "infra.functions.spend_guard.handler",
    )
    assert function["timeout"] == 60
    variables = function["environment"]["variables"]
    assert sum(len(k) + len(v) for k, v in variables.items()) < LAMBDA_ENVIRONMENT_BYTES
    settings = GuardSettings.from_environment(variables)
    assert settings.table == one(run, TABLE).state["name"]
    assert settings.topic_arn == one(run, TOPIC).state["arn"]
    assert settings.cost_tag == COST_TAG
    assert (settings.budget_usd, settings.budget_period) == (BASE_CONFIG["budgetUsd"], "MONTHLY")
    assert settings.thresholds_percent == (50.0, 80.0, 100.0)
    instance_type = run.outputs["instance_type"]
    price = data_file_prices(instance_type)
    assert settings.region == "us-east-1"
    assert settings.price(instance_type, "on-demand") == price.on_demand_usd_per_hour
    assert settings.price(instance_type, "spot") == price.spot_usd_per_hour
    # us-east-1's gp3 and gp2 storage (Amazon EBS pricing) and a public IPv4 address.
    assert (settings.ebs_usd_per_gb_month["gp3"], settings.ebs_usd_per_gb_month["gp2"]) == (
        0.08,
        0.10,
    )
    assert settings.public_ipv4_usd_per_hour == 0.005


def test_the_schedule_runs_the_function_every_five_minutes_as_its_own_role(profile_run):
    _, run = profile_run
    schedule = one(run, SCHEDULE).inputs
    assert schedule["scheduleExpression"] == "rate(5 minutes)"
    assert schedule["flexibleTimeWindow"] == {"mode": "OFF"}
    function_arn = one(run, FUNCTION).state["arn"]
    assert schedule["target"]["arn"] == function_arn
    (role,) = [r for r in of_type(run, ROLE) if r.name.endswith("-spend-guard-schedule")]
    assert schedule["target"]["roleArn"] == role.state["arn"]
    trust = json.loads(role.inputs["assumeRolePolicy"])["Statement"]
    assert [s["Principal"]["Service"] for s in trust] == ["scheduler.amazonaws.com"]
    assert policy(run, "-spend-guard-schedule")["Statement"] == [
        {"Effect": "Allow", "Action": "lambda:InvokeFunction", "Resource": function_arn}
    ]


def test_the_role_stops_only_the_stacks_tagged_instances_and_touches_only_its_own(profile_run):
    _, run = profile_run
    statements = {s["Sid"]: s for s in policy(run, "-spend-guard")["Statement"]}
    the_stacks = {"StringEquals": {"aws:ResourceTag/gpu-stack": COST_TAG[1]}}
    # The EC2 actions that change anything: stop and terminate, of the stack's tagged
    # instances only; nothing starts or launches.
    mutating = {
        action: s.get("Condition")
        for s in statements.values()
        for action in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])
        if action.startswith("ec2:") and not action.startswith("ec2:Describe")
    }
    assert mutating == {"ec2:StopInstances": the_stacks, "ec2:TerminateInstances": the_stacks}
    # Neither a cluster's fleet nor a Capacity Block here: no permission for them.
    assert "StopTheClustersComputeFleet" not in statements
    assert statements["ReadInstancesAndSpotPrices"]["Action"] == [
        "ec2:DescribeInstances",
        "ec2:DescribeSpotPriceHistory",
        "ec2:DescribeVolumes",
        "ec2:DescribeNatGateways",
    ]
    # No head node to reach: no Run Command.
    assert not any("ssm:" in str(s["Action"]) for s in statements.values())
    assert statements["KeepTheLedger"]["Resource"] == one(run, TABLE).state["arn"]
    assert statements["Alert"]["Resource"] == one(run, TOPIC).state["arn"]
    (role,) = [r for r in of_type(run, ROLE) if r.name.endswith("-spend-guard")]
    trust = json.loads(role.inputs["assumeRolePolicy"])["Statement"]
    assert [s["Principal"]["Service"] for s in trust] == ["lambda.amazonaws.com"]


def test_the_ledger_table_is_keyed_by_period(profile_run):
    _, run = profile_run
    table = one(run, TABLE).inputs
    assert table["hashKey"] == "period" and table["billingMode"] == "PAY_PER_REQUEST"
    assert table["attributes"] == [{"name": "period", "type": "S"}]
    assert run.outputs["spend_ledger_table"] == one(run, TABLE).state["name"]


def test_a_stack_in_eu_west_1_hands_the_function_eu_west_1_prices():
    run = run_stack(instanceType="p3.2xlarge", **{"aws:region": "eu-west-1"})
    settings = GuardSettings.from_environment(one(run, FUNCTION).inputs["environment"]["variables"])
    assert settings.region == "eu-west-1"
    assert "p4de.24xlarge" not in settings.prices  # not offered there (prices.toml)
    # p3.2xlarge in eu-west-1: $3.305/h on-demand (prices.toml's eu-west-1 row), not
    # us-east-1's $3.06.
    assert settings.price("p3.2xlarge", "on-demand") == 3.305
    # EU (Ireland)'s EBS rates per GB-month (volume_and_address_prices.toml), not us-east-1's
    # ($0.08 gp3); public IPv4 is $0.005/h in every commercial region.
    assert settings.ebs_usd_per_gb_month == {
        "gp3": 0.088,
        "gp2": 0.11,
        "io1": 0.138,
        "io2": 0.138,
        "st1": 0.05,
        "sc1": 0.0168,
        "standard": 0.055,
    }
    assert settings.public_ipv4_usd_per_hour == 0.005


def test_a_cluster_stacks_guard_may_stop_only_its_own_clusters_compute_fleet():
    run = run_stack(cluster="slurm", nodes=2)
    settings = GuardSettings.from_environment(one(run, FUNCTION).inputs["environment"]["variables"])
    template = json.loads(one(run, STACK).inputs["templateBody"])
    cluster_name = template["Resources"]["PclusterCluster"]["Properties"]["ClusterName"]
    assert settings.cluster_name == cluster_name
    statements = {s["Sid"]: s for s in policy(run, "-spend-guard")["Statement"]}
    fleet = statements["StopTheClustersComputeFleet"]
    assert fleet["Action"] == "dynamodb:UpdateItem"
    assert fleet["Resource"].endswith(f":table/parallelcluster-{cluster_name}")


def test_a_cluster_stacks_guard_may_hold_its_jobs_on_its_own_instances_only_and_has_the_time():
    run = run_stack(cluster="slurm", nodes=2)
    function = one(run, FUNCTION).inputs
    settings = GuardSettings.from_environment(function["environment"]["variables"])
    assert settings.cluster_queue == "gpu" == run.outputs["queue"]
    # A NAT gateway at us-east-1's rate (parallelcluster.toml), counted while it exists.
    network = tomllib.loads(PARALLELCLUSTER_PATH.read_text())["network"]["prices"]["us-east-1"]
    assert settings.nat_gateway_usd_per_hour == network["nat_gateway_usd_per_hour"] == 0.045
    statements = {s["Sid"]: s for s in policy(run, "-spend-guard")["Statement"]}
    hold = statements["HoldTheClustersJobs"]
    assert hold["Action"] == "ssm:SendCommand"
    assert hold["Resource"].endswith(":instance/*")
    assert hold["Condition"] == {"StringEquals": {"ssm:resourceTag/gpu-stack": COST_TAG[1]}}
    document = statements["WithTheShellScriptDocument"]["Resource"]
    assert document == "arn:aws:ssm:us-east-1::document/AWS-RunShellScript"
    assert statements["ReadTheHoldsResult"]["Action"] == "ssm:GetCommandInvocation"
    # Holding the jobs waits at most 210 s (KillWait 120 s + 60 s + 30 s for SSM) before the
    # stop goes on: the function's 60 s, and that.
    assert function["timeout"] == 60 + 120 + 60 + 30


def test_a_capacity_block_stacks_guard_reads_the_block_it_counts():
    run = run_stack(profile="a100x8", capacityBlockId="cr-0123456789abcdef0")
    settings = GuardSettings.from_environment(one(run, FUNCTION).inputs["environment"]["variables"])
    assert settings.capacity_block_id == "cr-0123456789abcdef0"
    statements = {s["Sid"]: s for s in policy(run, "-spend-guard")["Statement"]}
    assert "ec2:DescribeCapacityReservations" in statements["ReadInstancesAndSpotPrices"]["Action"]


def test_a_cluster_stack_in_eu_west_1_prices_its_head_node_at_eu_west_1s_price():
    run = run_stack(cluster="slurm", nodes=2, **{"aws:region": "eu-west-1"})
    settings = GuardSettings.from_environment(one(run, FUNCTION).inputs["environment"]["variables"])
    head, virginia = data_file_head_node("eu-west-1"), data_file_head_node("us-east-1")
    assert head.on_demand_usd_per_hour != virginia.on_demand_usd_per_hour
    assert settings.region == "eu-west-1"
    assert settings.price(head.instance_type, "on-demand") == head.on_demand_usd_per_hour


@pytest.mark.parametrize("profile", sorted(load_profiles().profiles))
def test_a_slurm_cluster_stack_has_the_guard_the_topic_its_subscriptions_and_the_budget(profile):
    run = run_stack(profile=profile, cluster="slurm", nodes=2, alertEmails=["a@x.org", "b@x.org"])
    topic_arn = one(run, TOPIC).state["arn"]
    subscriptions = of_type(run, SUBSCRIPTION)
    assert {(s.inputs["protocol"], s.inputs["endpoint"]) for s in subscriptions} == {
        ("email", "a@x.org"),
        ("email", "b@x.org"),
    }
    assert all(s.inputs["topic"] == topic_arn for s in subscriptions)
    budget = one(run, BUDGET).inputs
    assert float(budget["limitAmount"]) == BASE_CONFIG["budgetUsd"]
    assert budget["costFilters"] == [
        {"name": "TagKeyValue", "values": [f"user:{COST_TAG[0]}${COST_TAG[1]}"]}
    ]
    assert run.outputs["budget_name"] == budget["name"]
    assert run.outputs["alert_topic_arn"] == topic_arn
    settings = GuardSettings.from_environment(one(run, FUNCTION).inputs["environment"]["variables"])
    assert settings.topic_arn == topic_arn and settings.cost_tag == COST_TAG
    assert run.outputs["spend_ledger_table"] == one(run, TABLE).state["name"]
    assert one(run, SCHEDULE).inputs["scheduleExpression"] == "rate(5 minutes)"
    # Priced for the queue's nodes and the head node: an unknown type would stop the cluster.
    head = data_file_head_node("us-east-1")
    assert settings.price(head.instance_type, "on-demand") == head.on_demand_usd_per_hour
    instance_type = run.outputs["instance_type"]
    assert (
        settings.price(instance_type, "spot") == data_file_prices(instance_type).spot_usd_per_hour
    )
    # ParallelCluster puts the stack's cost tag on every node it starts: the guard finds them.
    config = json.loads(one(run, STACK).inputs["templateBody"])["Resources"]["PclusterCluster"]
    tags = config["Properties"]["ClusterConfiguration"]["Tags"]
    assert {"Key": COST_TAG[0], "Value": COST_TAG[1]} in tags


def test_the_archive_holds_the_function_package_and_imports_on_its_own(tmp_path):
    archive = function_archive()
    assert set(archive.assets) == {
        "infra/__init__.py",
        "infra/functions",
        "common/__init__.py",
        "common/market.py",
    }
    assert archive.assets["infra/functions"].path == str(FUNCTIONS_DIR)
    # Lay the archive out as Lambda unpacks it and import the handler from there alone.
    for name, asset in archive.assets.items():
        target = tmp_path / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(asset, pulumi.StringAsset):
            target.write_text(asset.text)
        elif isinstance(asset, pulumi.FileArchive):
            shutil.copytree(asset.path, target)
        else:
            shutil.copy(asset.path, target)
    probe = (
        "import infra.functions.spend_guard as guard, sys; "
        "assert guard.__file__.startswith(sys.argv[1]), guard.__file__; "
        "heavy = ('infra.knowledge', 'pulumi', 'pydantic'); "
        "assert not any(m.startswith(heavy) for m in sys.modules)"
    )
    subprocess.run(
        [sys.executable, "-c", probe, str(tmp_path)], cwd=tmp_path, check=True, timeout=60
    )
