"""The whole program, per profile, on-demand and spot (one run per case)."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pulumi
import pytest

from infra.dryrun.mocks import RecordingMocks
from infra.dryrun.runner import PROJECT, run_program
from infra.jobs import hf_token
from infra.knowledge.profiles import load_profiles
from infra.outputs import read_outputs
from infra.project import WITHOUT_NODES_ENV
from policy import rules
from tests.support.infra import data_file_prices
from tests.support.mock_runs import of_type, one
from tests.support.stack_runs import (
    BASE_CONFIG,
    INSTANCE,
    LAUNCH_TEMPLATE,
    PLACEMENT_GROUP,
    SECURITY_GROUP,
    boot_env,
    boot_files,
    node_policy,
    nodes_in_rank_order,
    run_stack,
    training_log_group,
)
from tests.support.tools import require_tool

PROFILES = tuple(load_profiles().profiles)
CASES = [(profile, 1, spot) for profile in PROFILES for spot in (False, True)]


def test_every_profile_is_covered():
    assert set(PROFILES) == {"l4x1", "l40sx4", "a100x8-80g", "a100x8"}


@dataclass(frozen=True)
class Expected:
    """What a profile's stack must be, pinned from the data's cited sources."""

    instance_type: str
    gpu_count: int
    gpu_model: str
    nodes: int = 1
    # CUDA 13.0 GA needs driver >= 580.65.06 (NVIDIA CUDA Toolkit release notes, table 3).
    min_driver: str = "580.65.06"
    # images/matrix.toml's default variant: torch 2.13.0 on CUDA 13.0, Python 3.12.
    image_tag: str = "0.1.0-torch2.13.0-cu130-py3.12"


# The profiles' instance types and their GPUs (EC2 accelerated computing instance pages).
EXPECTED = {
    "l4x1": Expected("g6.2xlarge", 1, "L4"),
    "l40sx4": Expected("g6e.12xlarge", 4, "L40S"),
    "a100x8-80g": Expected("p4de.24xlarge", 8, "A100"),
    "a100x8": Expected("p4d.24xlarge", 8, "A100"),
}


@pytest.fixture(
    scope="module", params=CASES, ids=[f"{p}-{n}node-{'spot' if s else 'od'}" for p, n, s in CASES]
)
def case(request):
    profile, nodes, spot = request.param
    run = run_stack(profile=profile, nodes=nodes, spot=spot)
    return EXPECTED[profile], spot, run


# Every profile's GPU runs the DLAMI Base OSS Nvidia Driver GPU AMI on Amazon Linux 2023: its
# SSM parameter ("Finding the ID of a DLAMI", docs.aws.amazon.com/dlami/latest/devguide/
# find-dlami-id.html) and root device (EC2 User Guide, "Device names for volumes").
AL2023_DLAMI = (
    "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-amazon-linux-2023"
    "/latest/ami-id"
)
AL2023_ROOT_DEVICE = "/dev/xvda"


def test_ami_is_the_resolvers_ssm_parameter(case):
    plan, _, run = case
    template = one(run, LAUNCH_TEMPLATE).inputs
    assert template["imageId"] == f"resolve:ssm:{AL2023_DLAMI}"
    assert template["instanceType"] == plan.instance_type


def test_imdsv2_required_with_two_hops_for_containers(case):
    _, _, run = case
    metadata = one(run, LAUNCH_TEMPLATE).inputs["metadataOptions"]
    assert metadata["httpTokens"] == "required"
    assert metadata["httpPutResponseHopLimit"] == 2
    assert metadata["httpEndpoint"] == "enabled"


def test_root_volume_is_encrypted_gp3_and_sized(case):
    _, _, run = case
    (root,) = one(run, LAUNCH_TEMPLATE).inputs["blockDeviceMappings"]
    assert root["ebs"] == root["ebs"] | {
        "encrypted": "true",
        "volumeType": "gp3",
        "volumeSize": 500,
    }
    assert root["deviceName"] == AL2023_ROOT_DEVICE


def test_no_inbound_from_the_internet_and_no_ssh(case):
    _, _, run = case
    ingress = one(run, SECURITY_GROUP).inputs.get("ingress", [])
    assert all(not rule.get("cidrBlocks") for rule in ingress)
    assert all(not rule.get("ipv6CidrBlocks") for rule in ingress)
    assert ingress == []


def test_one_plain_interface_with_a_public_address_and_no_placement_group(case):
    _, _, run = case
    template = one(run, LAUNCH_TEMPLATE).inputs
    (interface,) = template["networkInterfaces"]
    assert not interface.get("interfaceType")
    assert interface["associatePublicIpAddress"] == "true"
    assert "groupName" not in template["placement"]
    assert of_type(run, PLACEMENT_GROUP) == []
    assert of_type(run, "aws:ec2/eip:Eip") == []


def test_one_instance_per_node_from_the_template_in_the_chosen_market(case):
    plan, spot, run = case
    template = one(run, LAUNCH_TEMPLATE)
    nodes = nodes_in_rank_order(run)
    assert len(nodes) == plan.nodes
    assert of_type(run, "aws:ec2/spotInstanceRequest:SpotInstanceRequest") == []
    for node in nodes:
        assert node.inputs["launchTemplate"]["id"] == template.id
        market = node.inputs.get("instanceMarketOptions")
        if spot:
            assert market == {
                "marketType": "spot",
                "spotOptions": {
                    "spotInstanceType": "persistent",
                    "instanceInterruptionBehavior": "stop",
                },
            }
        else:
            assert market is None


def test_user_data_checks_the_driver_and_runs_the_image_with_the_nodes_env(case):
    plan, _, run = case
    for node in nodes_in_rank_order(run):
        files = boot_files(node)
        script = files["/opt/gpu-stack/run-training.sh"]
        assert "nvidia-smi --query-gpu=driver_version --format=csv,noheader" in script
        assert f'readonly MIN_DRIVER="{plan.min_driver}"' in script
        assert f'readonly IMAGE_URI="{run.outputs["image_uri"]}"' in script
        assert run.outputs["image_uri"].endswith(f":{plan.image_tag}")
        env = boot_env(node)
        # One node: the trainer's own rendezvous defaults, no EFA wiring (that is the cluster's).
        rendezvous = ("TRAIN_NNODES", "TRAIN_NODE_RANK", "TRAIN_MASTER_ADDR", "TRAIN_MASTER_PORT")
        assert not set(rendezvous) & set(env)
        assert "FI_PROVIDER" not in env
        # Each job's checkpoints: a prefix and a folder per job name, set by the job watcher.
        watcher = files["/opt/gpu-stack/watch-jobs.py"]
        assert f'CHECKPOINT_URI = "{run.outputs["checkpoint_uri"]}"' in watcher
        assert f'SPOOL_URI = "s3://{run.outputs["checkpoint_bucket"]}/jobs"' in watcher
        assert '"/var/lib/gpu-stack/checkpoints"' in watcher
        unit = files["/etc/systemd/system/gpu-training.service"]
        assert "Restart=on-failure" in unit and "RestartPreventExitStatus=2" in unit
        # The health gate's figures: the catalog's GPUs; no EFA on a single node.
        assert env["TRAIN_EXPECT_GPUS"] == str(plan.gpu_count)
        assert env["TRAIN_EXPECT_GPU_MODEL"] == plan.gpu_model
        assert "TRAIN_EXPECT_EFA" not in env
        alerts = one(run, "aws:sns/topic:Topic").state["arn"]
        assert f'readonly ALERT_TOPIC_ARN="{alerts}"' in script


def test_instance_role_names_only_the_stacks_own_resources(case):
    _, _, run = case
    bucket = one(run, "aws:s3/bucket:Bucket").state["arn"]
    repository = one(run, "aws:ecr/repository:Repository").state["arn"]
    log_group = training_log_group(run).state["arn"]
    alerts = one(run, "aws:sns/topic:Topic").state["arn"]  # a failed health gate's reason
    # The stack's HF_TOKEN secret, named after the stack (project "gpu-training-stack").
    secret = hf_token.secret_arn(log_group, hf_token.secret_name("gpu-training-stack-test"))
    own = {bucket, f"{bucket}/*", repository, log_group, f"{log_group}:*", alerts, secret}
    for statement in node_policy(run)["Statement"]:
        actions = _as_list(statement["Action"])
        resources = _as_list(statement["Resource"])
        if resources == ["*"]:
            # The two actions without resource-level permissions, narrowed as far as AWS allows.
            assert actions in (["ecr:GetAuthorizationToken"], ["cloudwatch:PutMetricData"])
            if actions == ["cloudwatch:PutMetricData"]:
                assert "cloudwatch:namespace" in statement["Condition"]["StringEquals"]
        else:
            assert set(resources) <= own, statement
        assert not any(action.endswith(":*") or action == "*" for action in actions)


def test_every_aws_resource_uses_the_tagged_provider(case):
    _, _, run = case
    (provider,) = of_type(run, "pulumi:providers:aws")
    # Provider inputs travel as JSON text.
    tags = json.loads(provider.inputs["defaultTags"])
    assert tags == {"tags": {"gpu-stack": "gpu-training-stack-test"}}
    aws_resources = [r for r in run.resources if r.type.startswith("aws:")]
    assert len(aws_resources) > 20
    for resource in aws_resources:
        assert resource.provider.endswith(f"::{provider.name}::{provider.id}"), resource.type


def test_outputs_name_instances_sessions_image_and_bucket(case):
    _, spot, run = case
    outputs = run.outputs
    nodes = nodes_in_rank_order(run)
    assert outputs["instance_ids"] == [node.id for node in nodes]
    assert outputs["private_ips"] == [node.state["privateIp"] for node in nodes]
    assert outputs["ssm_sessions"] == [
        f"aws ssm start-session --target {instance_id}" for instance_id in outputs["instance_ids"]
    ]
    assert outputs["checkpoint_bucket"] == one(run, "aws:s3/bucket:Bucket").state["bucket"]
    # The tag the nodes carry (tests/infra/components/test_compute.py), as the commands read it.
    assert outputs["cost_tag"] == f"gpu-stack={PROJECT}-test"
    assert ("cancel_spot_requests" in outputs) == spot
    if spot:
        requests = [node.state["spotInstanceRequestId"] for node in nodes]
        assert outputs["cancel_spot_requests"] == (
            "aws ec2 cancel-spot-instance-requests --region us-east-1 "
            f"--spot-instance-request-ids {' '.join(requests)}"
        )


def test_cost_outputs_price_every_node_in_both_markets_with_the_runway(case):
    plan, spot, run = case
    outputs = run.outputs
    instance = data_file_prices(plan.instance_type)
    on_demand = instance.on_demand_usd_per_hour * plan.nodes
    spot_price = instance.spot_usd_per_hour * plan.nodes
    hourly = spot_price if spot else on_demand
    budget = BASE_CONFIG["budgetUsd"]  # monthly, the default period
    assert outputs["on_demand_usd_per_hour"] == pytest.approx(on_demand, abs=0.005)
    assert outputs["spot_usd_per_hour"] == pytest.approx(spot_price, abs=0.005)
    assert outputs["hourly_cost_usd"] == pytest.approx(hourly, abs=0.005)
    assert outputs["monthly_budget_usd"] == budget
    # At most the budget's month (730 h): a cheap node outlasts the month on the budget.
    assert outputs["runway_hours"] == pytest.approx(min(budget / hourly, 730.0), abs=0.05)


def test_cost_outputs_turn_a_daily_budget_into_a_monthly_one():
    outputs = run_stack(profile="l4x1", spot=True, budgetUsd=5, budgetPeriod="DAILY").outputs
    spot_price = data_file_prices("g6.2xlarge").spot_usd_per_hour
    assert outputs["monthly_budget_usd"] == pytest.approx(5 * 365 / 12, abs=0.005)
    # The runway is what one period's budget buys: hours a day here.
    assert outputs["runway_hours"] == pytest.approx(5 / spot_price, abs=0.05)


def _as_list(value: str | list[str]) -> list[str]:
    return value if isinstance(value, list) else [value]


def test_training_data_is_synced_from_s3_into_scratch(tmp_path):
    run = run_stack(dataS3Uri="s3://corpus/tokens/v2")
    (node,) = nodes_in_rank_order(run)
    assert boot_env(node)["TRAIN_DATA_PATH"] == "/scratch/data"
    script = boot_files(node)["/opt/gpu-stack/run-training.sh"]
    assert 'readonly DATA_S3_URI="s3://corpus/tokens/v2"' in script


def test_instance_store_count_reaches_the_scratch_script():
    run = run_stack(profile="a100x8")
    (node,) = nodes_in_rank_order(run)
    script = boot_files(node)["/opt/gpu-stack/prepare-scratch.sh"]
    # p4d.24xlarge: 8 x 1000 GB NVMe SSD instance store (EC2 P4 instance page).
    assert 'readonly EXPECTED_DRIVES="8"' in script


def test_programs_user_data_is_valid_cloud_config_with_clean_shell(tmp_path):
    cloud_init = require_tool("cloud-init", "cloud-init")
    shellcheck = require_tool("shellcheck", "shellcheck")
    toml = tmp_path / "job.toml"
    toml.write_text("[optimizer]\nlr = 3e-4\n")
    run = run_stack(spot=True, dataS3Uri="s3://corpus/tokens", trainConfig=str(toml))
    for node in nodes_in_rank_order(run):
        user_data = tmp_path / f"{node.name}.yaml"
        user_data.write_text(node.inputs["userData"])
        schema = subprocess.run(
            [cloud_init, "schema", "--config-file", str(user_data)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert schema.returncode == 0 and "Valid cloud-config" in schema.stdout, schema.stdout
        scripts = []
        for path, content in boot_files(node).items():
            if path.endswith(".sh"):
                scripts.append(tmp_path / f"{node.name}-{Path(path).name}")
                scripts[-1].write_text(content)
        assert len(scripts) == 3
        lint = subprocess.run(
            [shellcheck, *map(str, scripts)], capture_output=True, text=True, timeout=60
        )
        assert lint.returncode == 0, lint.stdout


@pytest.mark.parametrize("spot", [False, True])
def test_the_stack_passes_the_policy_packs_checks(spot):
    run = run_stack(spot=spot, sshCidr="203.0.113.7/32")
    allowed = rules.catalog_instance_types()
    for resource in run.resources:
        props = resource.state
        assert rules.check_imdsv2(resource.type, props) == [], resource.name
        assert rules.check_volume_encryption(resource.type, props) == [], resource.name
        assert rules.check_no_public_ssh(resource.type, props) == [], resource.name
        assert rules.check_gpu_instance_type(resource.type, props, allowed) == [], resource.name
    stack = [rules.StackResource(r.type, r.name, r.state, id=r.id) for r in run.resources]
    assert rules.check_budget_for_gpus(stack) == []
    assert rules.check_bucket_encryption(stack) == []


def test_warnings_output_holds_the_plans_and_the_guardrails():
    run = run_stack(instanceType="p3.2xlarge", alertEmails=["you@example.com"])
    warnings = run.outputs["warnings"]
    assert any("past end of life" in w or "end of life" in w for w in warnings), warnings
    assert any("you@example.com" in w for w in warnings), warnings
    assert not any(
        "alertEmails" in w for w in run_stack(alertEmails=["ml@company.io"]).outputs["warnings"]
    )


def test_a_stack_is_priced_for_its_own_region():
    config = {**BASE_CONFIG, "instanceType": "p3.2xlarge"}
    run = run_program(config, stack="test", aws_region="eu-west-1")
    # p3.2xlarge in eu-west-1: $3.305/h on-demand (prices.toml), not us-east-1's $3.06.
    assert run.outputs["on_demand_usd_per_hour"] == pytest.approx(3.305, abs=0.005)


def test_a_region_without_prices_fails_preview_in_one_sentence():
    with pytest.raises(pulumi.RunError) as caught:
        run_program(BASE_CONFIG, stack="test", aws_region="eu-west-3")
    message = str(caught.value)
    assert "\n" not in message and message.startswith("aws:region is 'eu-west-3': ")
    assert "regions with prices: eu-west-1, us-east-1, us-west-2" in message


@pytest.mark.parametrize("nodes", [2, 16])
def test_more_than_one_node_without_the_cluster_fails_preview_creating_nothing(nodes):
    mocks = RecordingMocks()
    with pytest.raises(pulumi.RunError) as caught:
        run_stack(mocks, nodes=nodes)
    message = str(caught.value)
    assert "\n" not in message
    assert f"gpu:nodes is {nodes}" in message and "set gpu:cluster: slurm" in message
    assert mocks.resources == []


def test_without_its_nodes_the_stack_has_everything_they_need_and_no_instance(monkeypatch):
    """`up` builds a new stack without its nodes until their image is pushed: the repository
    it is pushed to, the bucket, the network and the guardrails exist; nothing that bills by
    the hour does, and the outputs say so (no instance: the commands call it not up)."""
    complete = {(r.type, r.name) for r in run_stack(spot=True).resources}
    monkeypatch.setenv(WITHOUT_NODES_ENV, "1")
    run = run_stack(spot=True)
    made = {(r.type, r.name) for r in run.resources}
    left_out = {kind for kind, _ in complete - made}
    assert made < complete
    assert INSTANCE in left_out and LAUNCH_TEMPLATE in left_out
    assert not of_type(run, INSTANCE) and not of_type(run, LAUNCH_TEMPLATE)
    for kept in ("aws:ecr/repository:Repository", "aws:s3/bucket:Bucket", SECURITY_GROUP):
        assert of_type(run, kept), kept
    assert run.outputs["instance_ids"] == [] and "cancel_spot_requests" not in run.outputs
    assert read_outputs("test", run.outputs).has_compute is False
