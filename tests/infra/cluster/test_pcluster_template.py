"""ParallelCluster's own CloudFormation for the stack's cluster config, synthesized offline.

tests/infra/cluster/pcluster_template.py runs aws-parallelcluster 3.15.1's template
builder (pcluster.templates.cdk_builder) in .venv-pcluster, with moto answering its AWS
look-ups, on configs rendered by infra.cluster.config. What ParallelCluster would create
is asserted here: the head node's security group, its network interface and launch
template (no public address: its way out is the subnet's route, the stack's NAT gateway),
the compute nodes' interfaces, the node roles' policies, the log group's deletion policy
and the cluster's default user.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from common.market import Market
from infra.cluster.config import DEFAULT_USER, SSM_POLICY, cluster_config
from infra.components.network import PRIVATE_SUBNET_CIDR, VPC_CIDR
from infra.knowledge.resolver import resolve
from tests.infra.cluster.test_config import PARALLELCLUSTER, pcluster_python, settings
from tests.support.tools import _unavailable

__all__ = ["pcluster_python"]  # the fixture, shared with test_config

SYNTH_SCRIPT = Path(__file__).with_name("pcluster_template.py")
LIMITED_SSH = "203.0.113.0/24"


def all_resources(synthesized: dict) -> dict:
    resources = dict(synthesized["template"]["Resources"])
    for nested in synthesized["nested"]:
        resources.update(nested.get("Resources", {}))
    return resources


def of_type(synthesized: dict, resource_type: str) -> dict:
    return {k: v for k, v in all_resources(synthesized).items() if v["Type"] == resource_type}


@pytest.fixture(scope="module")
def synthesized(pcluster_python) -> list[dict]:
    """[the default settings' cluster, a cluster with gpu:sshCidr and deleteDataOnDestroy]."""
    plan = resolve("p4d.24xlarge", nodes=2, cluster=PARALLELCLUSTER.release())
    configs = [
        cluster_config(plan, settings(market=Market.SPOT)),
        cluster_config(
            plan,
            settings(market=Market.SPOT, ssh_allowed_cidr=LIMITED_SSH, delete_logs_on_destroy=True),
        ),
    ]
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": os.environ.get("HOME", "/tmp"),
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "VPC_CIDR": VPC_CIDR,
        "SUBNET_CIDR": PRIVATE_SUBNET_CIDR,
        # Packages for that interpreter installed outside it (moto), if any.
        "PYTHONPATH": os.environ.get("PCLUSTER_PYTHONPATH", ""),
    }
    result = subprocess.run(
        [pcluster_python, str(SYNTH_SCRIPT)],
        input=yaml.safe_dump(configs),
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    if result.returncode == 3:
        _unavailable(result.stdout.strip())
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)


def test_ssh_to_the_head_node_is_open_to_the_vpc_or_gpu_ssh_cidr_only(synthesized):
    for cluster, allowed in zip(synthesized, [VPC_CIDR, LIMITED_SSH], strict=True):
        group = all_resources(cluster)["HeadNodeSecurityGroup"]["Properties"]
        assert group["SecurityGroupIngress"] == [
            {"CidrIp": allowed, "FromPort": 22, "IpProtocol": "tcp", "ToPort": 22}
        ]
        ingress = [
            rule
            for kind in ("AWS::EC2::SecurityGroup", "AWS::EC2::SecurityGroupIngress")
            for resource in of_type(cluster, kind).values()
            for rule in resource["Properties"].get("SecurityGroupIngress", [resource["Properties"]])
        ]
        assert all(rule.get("CidrIp") != "0.0.0.0/0" for rule in ingress)
    assert VPC_CIDR == "10.42.0.0/16"


def test_no_node_gets_a_public_address_so_the_subnets_route_is_their_way_out(synthesized):
    cluster = synthesized[0]
    assert of_type(cluster, "AWS::EC2::EIP") == {}
    resources = all_resources(cluster)
    assert resources["HeadNodeENI"]["Properties"]["SubnetId"] == cluster["subnet"]
    head = resources["HeadNodeLaunchTemplate"]["Properties"]["LaunchTemplateData"]
    # A pre-created interface at eth0: EC2 gives no public IPv4 to an existing interface.
    assert head["NetworkInterfaces"] == [
        {"DeviceIndex": 0, "NetworkInterfaceId": {"Ref": "HeadNodeENI"}}
    ]
    templates = [
        lt
        for name, lt in of_type(cluster, "AWS::EC2::LaunchTemplate").items()
        if name != "HeadNodeLaunchTemplate"
    ]
    (compute,) = templates
    interfaces = compute["Properties"]["LaunchTemplateData"]["NetworkInterfaces"]
    assert len(interfaces) == 5  # p4d.24xlarge: eth0 and 4 EFA-only cards
    assert {interface["SubnetId"] for interface in interfaces} == {cluster["subnet"]}
    assert not any(interface.get("AssociatePublicIpAddress") for interface in interfaces)


def test_the_node_roles_carry_the_stacks_policy_and_ssm(synthesized):
    roles = of_type(synthesized[0], "AWS::IAM::Role")
    managed = {
        name: role["Properties"].get("ManagedPolicyArns", []) for name, role in roles.items()
    }
    assert SSM_POLICY in managed["RoleHeadNode"]
    node_policy = settings().node_policy_arn
    (compute,) = [name for name, arns in managed.items() if node_policy in arns]
    assert compute != "RoleHeadNode"


def test_the_log_group_is_kept_or_deleted_as_the_stack_says(synthesized):
    policies = [
        group["DeletionPolicy"]
        for cluster in synthesized
        for name, group in of_type(cluster, "AWS::Logs::LogGroup").items()
        if name == "CloudWatchLogGroup"
    ]
    assert policies == ["Retain", "Delete"]
    (group,) = [
        g
        for n, g in of_type(synthesized[0], "AWS::Logs::LogGroup").items()
        if n == "CloudWatchLogGroup"
    ]
    assert group["Properties"]["LogGroupName"].startswith("/aws/parallelcluster/gpu-stack-test-")


def test_the_clusters_default_user_is_the_one_jobs_are_submitted_as(synthesized):
    default = synthesized[0]["template"]["Parameters"]["ClusterUser"]["Default"]
    assert default == DEFAULT_USER == "ubuntu"
