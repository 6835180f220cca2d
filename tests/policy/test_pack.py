"""The policy pack as `pulumi preview --policy-pack policy` runs it, on recorded resources.

Resource policies see a resource's inputs, stack policies every resource's outputs, both behind
the policy SDK's unknown-checking proxy: the same shapes the engine hands over.
"""

import copy
import runpy
from pathlib import Path

import pulumi_aws as aws
import pytest
from pulumi_policy import (
    PolicyResource,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
)
from pulumi_policy.proxy import unknown_checking_proxy

from infra.components.guardrails import Guardrails, GuardrailsArgs
from infra.config.guardrails import GuardrailConfig
from infra.config.stack_file import REPO_ROOT
from infra.dryrun.mocks import Recorded
from infra.dryrun.runner import run_stack_file
from infra.knowledge.profiles import resolve_profile
from tests.support.mock_runs import run_under_mocks

PACK = runpy.run_path(str(REPO_ROOT / "policy"), run_name="policy_pack")
POLICIES = PACK["POLICIES"]
STACK_FILES = sorted(REPO_ROOT.glob("Pulumi.*.yaml"))


def urn(resource: Recorded) -> str:
    return f"urn:pulumi:test::gpu-training-stack::{resource.type}::{resource.name}"


def evaluate(resources: list[Recorded], config: dict | None = None) -> list[tuple[str, str]]:
    """(policy name, message) of every violation the pack reports on `resources`."""
    found: list[tuple[str, str]] = []
    for policy in POLICIES:
        policy_config = (config or {}).get(policy.name, {})

        def report(message, _urn=None, name=policy.name):
            found.append((name, message))

        if isinstance(policy, ResourceValidationPolicy):
            for resource in resources:
                props = unknown_checking_proxy(copy.deepcopy(resource.inputs))
                args = ResourceValidationArgs(
                    resource.type, props, urn(resource), resource.name, None, None, policy_config
                )
                policy.validate(args, report)
        else:
            stack = [
                PolicyResource(
                    resource.type,
                    unknown_checking_proxy(copy.deepcopy(resource.state)),
                    urn(resource),
                    resource.name,
                    None,
                    None,
                    None,
                    [],
                    {},
                )
                for resource in resources
            ]
            policy.validate(StackValidationArgs(stack, policy_config), report)
    return found


def test_pack_has_every_policy():
    assert [policy.name for policy in POLICIES] == [
        "gpu-budget-required",
        "imdsv2-required",
        "ebs-encrypted",
        "s3-bucket-encrypted",
        "no-public-ssh",
        "gpu-instance-types-allowed",
    ]


@pytest.mark.parametrize("stack_file", STACK_FILES, ids=lambda path: path.name)
def test_example_stacks_pass_every_policy(stack_file: Path):
    run = run_stack_file(stack_file)
    types = {resource.type for resource in run.resources}
    # The run holds what the policies look at, so passing means something.
    assert {
        "aws:ec2/instance:Instance",
        "aws:ec2/launchTemplate:LaunchTemplate",
        "aws:ec2/securityGroup:SecurityGroup",
        "aws:s3/bucket:Bucket",
        "aws:budgets/budget:Budget",
    } <= types
    assert evaluate(run.resources) == []


def test_every_profile_is_in_an_example_stack():
    profiles = {path.name.removeprefix("Pulumi.").removesuffix(".yaml") for path in STACK_FILES}
    assert {"l4x1", "l40sx4", "a100x8-80g", "a100x8"} <= profiles


def careless_stack():
    """GPU instances with every guardrail missing."""
    aws.ec2.Instance(
        "node",
        instance_type="p6-b200.48xlarge",
        ami="ami-test",
        metadata_options={"http_tokens": "optional"},
        root_block_device={"volume_size": 500},
    )
    aws.ec2.LaunchTemplate(
        "template",
        instance_type="p4d.24xlarge",
        block_device_mappings=[{"device_name": "/dev/xvda", "ebs": {"volume_size": 500}}],
    )
    aws.ebs.Volume("scratch", availability_zone="us-east-1a", size=100)
    aws.s3.Bucket("data")
    aws.ec2.SecurityGroup(
        "open",
        ingress=[{"protocol": "tcp", "from_port": 22, "to_port": 22, "cidr_blocks": ["0.0.0.0/0"]}],
    )
    aws.vpc.SecurityGroupIngressRule(
        "open-v6", security_group_id="sg-1", ip_protocol="-1", cidr_ipv6="::/0"
    )


def test_every_violation_is_reported_with_its_message():
    mocks, _ = run_under_mocks(careless_stack)
    found = evaluate(mocks.resources)
    by_policy: dict[str, list[str]] = {}
    for name, message in found:
        by_policy.setdefault(name, []).append(message)

    assert by_policy["gpu-budget-required"] == [
        "the stack launches GPU instances [node (p6-b200.48xlarge), template (p4d.24xlarge)] "
        "without an AWS Budget: add a budget with notifications (the Guardrails component does) so "
        "spending is seen and stopped"
    ]
    assert [m.split(": ")[0] for m in by_policy["imdsv2-required"]] == [
        "instance does not require IMDSv2 (metadataOptions.httpTokens is optional)",
        "launch template does not require IMDSv2 (metadataOptions.httpTokens is unset)",
    ]
    assert by_policy["ebs-encrypted"] == [
        "instance root volume is not encrypted: set rootBlockDevice.encrypted to true",
        'launch template block device /dev/xvda is not encrypted: set ebs.encrypted to "true"',
        "EBS volume is not encrypted: set encrypted to true",
    ]
    assert [m.split(": ")[0] for m in by_policy["s3-bucket-encrypted"]] == [
        "S3 bucket data has no server-side encryption configuration"
    ]
    assert [m.split(": ")[0] for m in by_policy["no-public-ssh"]] == [
        "security group allows SSH (port 22) from 0.0.0.0/0",
        "ingress rule allows SSH (port 22) from ::/0",
    ]
    # p6-b200.48xlarge is not in the catalog: the default allowed list stops it.
    assert [m.split(": ")[0] for m in by_policy["gpu-instance-types-allowed"]] == [
        "GPU instance type p6-b200.48xlarge is not allowed"
    ]
    assert len(found) == 10


def test_allowed_gpu_types_come_from_the_policy_config():
    mocks, _ = run_under_mocks(careless_stack)
    config = {"gpu-instance-types-allowed": {"allowedInstanceTypes": ["p6-b200.48xlarge"]}}
    flagged = [m for name, m in evaluate(mocks.resources, config) if "types-allowed" in name]
    assert flagged == [
        "GPU instance type p4d.24xlarge is not allowed: use one of p6-b200.48xlarge, "
        "or add it to the policy's allowedInstanceTypes"
    ]


def test_the_guardrails_component_satisfies_the_budget_policy():
    plan = resolve_profile("a100x8")

    def guarded():
        node = aws.ec2.Instance(
            "node",
            instance_type=plan.instance.type,
            ami="ami-test",
            metadata_options={"http_tokens": "required"},
        )
        config = GuardrailConfig(budget_usd=500, alert_emails=("ml@example.com",))
        Guardrails("gpu", GuardrailsArgs(config, ("k", "v"))).watch([node.id])

    mocks, _ = run_under_mocks(guarded)
    assert evaluate(mocks.resources) == []
