"""The pack started the way the Pulumi CLI starts a Python policy pack, spoken to over gRPC.

`pulumi preview --policy-pack policy` runs `python -m pulumi.policy <engine> policy` in the pack's
virtualenv and talks to the analyzer it serves; this test does the same, without the CLI, on a
copy of the pack's folder alone: what `pulumi policy publish` uploads.
"""

import contextlib
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from google.protobuf import empty_pb2, struct_pb2
from pulumi.runtime.proto import analyzer_pb2, analyzer_pb2_grpc, plugin_pb2

from infra.config.stack_file import REPO_ROOT
from tests.policy.test_pack import POLICIES

MANDATORY = analyzer_pb2.EnforcementLevel.Value("MANDATORY")


@contextlib.contextmanager
def serve_pack(folder: Path) -> Iterator[analyzer_pb2_grpc.AnalyzerStub]:
    """The pack published into `folder` and served as Pulumi serves it."""
    shutil.copytree(REPO_ROOT / "policy", folder / "policy")
    process = subprocess.Popen(
        [sys.executable, "-u", "-m", "pulumi.policy", "127.0.0.1:1", "policy"],
        cwd=folder,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        port = process.stdout.readline().strip()
        assert port.isdigit(), f"the pack did not start: {process.stderr.read()}"
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            grpc.channel_ready_future(channel).result(timeout=30)
            yield analyzer_pb2_grpc.AnalyzerStub(channel)
    finally:
        process.kill()
        process.wait()


@pytest.fixture(scope="module")
def analyzer(tmp_path_factory) -> Iterator[analyzer_pb2_grpc.AnalyzerStub]:
    """The pack with its default configuration, for the tests that do not configure it."""
    with serve_pack(tmp_path_factory.mktemp("published")) as stub:
        yield stub


def struct(values: dict) -> struct_pb2.Struct:
    message = struct_pb2.Struct()
    message.update(values)
    return message


def analyze(analyzer, resource_type: str, props: dict) -> list[analyzer_pb2.AnalyzeDiagnostic]:
    request = analyzer_pb2.AnalyzeRequest(
        type=resource_type,
        properties=struct(props),
        urn=f"urn:pulumi:test::gpu::{resource_type}::r",
        name="r",
    )
    return list(analyzer.Analyze(request).diagnostics)


def test_pack_serves_its_policies_as_mandatory(analyzer):
    info = analyzer.GetAnalyzerInfo(empty_pb2.Empty())
    assert info.name == "gpu-training-guardrails"
    # Served as the pack declares them (tests.policy.test_pack lists the names).
    assert {policy.name for policy in info.policies} == {policy.name for policy in POLICIES}
    assert {policy.enforcementLevel for policy in info.policies} == {MANDATORY}


def test_public_ssh_is_a_mandatory_violation(analyzer):
    ingress = [{"protocol": "tcp", "fromPort": 22, "toPort": 22, "cidrBlocks": ["0.0.0.0/0"]}]
    (diagnostic,) = analyze(analyzer, "aws:ec2/securityGroup:SecurityGroup", {"ingress": ingress})
    assert diagnostic.policyName == "no-public-ssh"
    assert diagnostic.enforcementLevel == MANDATORY
    # The SDK puts the policy's description on the first line, the violation after it.
    description, violation = diagnostic.message.split("\n", 1)
    assert description == "No security group opens SSH (port 22) to 0.0.0.0/0 or ::/0."
    assert violation.startswith("security group allows SSH (port 22) from 0.0.0.0/0")


def test_compliant_launch_template_passes(analyzer):
    template = {
        "instanceType": "p4d.24xlarge",
        "metadataOptions": {"httpTokens": "required"},
        "blockDeviceMappings": [{"deviceName": "/dev/xvda", "ebs": {"encrypted": "true"}}],
    }
    assert analyze(analyzer, "aws:ec2/launchTemplate:LaunchTemplate", template) == []


def stack_resource(resource_type: str, name: str, props: dict) -> analyzer_pb2.AnalyzerResource:
    return analyzer_pb2.AnalyzerResource(
        type=resource_type,
        name=name,
        urn=f"urn:pulumi:test::gpu::{resource_type}::{name}",
        properties=struct(props),
    )


def test_gpu_stack_without_budget_fails_and_with_budget_passes(analyzer):
    node = stack_resource(
        "aws:ec2/instance:Instance",
        "node-0",
        {"instanceType": "p4d.24xlarge", "metadataOptions": {"httpTokens": "required"}},
    )
    request = analyzer_pb2.AnalyzeStackRequest(resources=[node])
    (diagnostic,) = analyzer.AnalyzeStack(request).diagnostics
    assert diagnostic.policyName == "gpu-budget-required"
    assert "GPU instances [node-0 (p4d.24xlarge)] without an AWS Budget" in diagnostic.message

    budget = stack_resource(
        "aws:budgets/budget:Budget",
        "budget",
        {"notifications": [{"notificationType": "ACTUAL", "threshold": 80}]},
    )
    request = analyzer_pb2.AnalyzeStackRequest(resources=[node, budget])
    assert list(analyzer.AnalyzeStack(request).diagnostics) == []


def test_allowed_types_follow_the_policy_pack_config(tmp_path):
    with serve_pack(tmp_path) as analyzer:  # its own: the configuration stays with the server
        configured_types_are_enforced(analyzer)


def configured_types_are_enforced(analyzer) -> None:
    template = {"instanceType": "p4de.24xlarge", "metadataOptions": {"httpTokens": "required"}}
    assert analyze(analyzer, "aws:ec2/launchTemplate:LaunchTemplate", template) == []

    config = analyzer_pb2.PolicyConfig(
        enforcementLevel=MANDATORY,
        properties=struct({"allowedInstanceTypes": ["p3.2xlarge"]}),
    )
    analyzer.Configure(
        analyzer_pb2.ConfigureAnalyzerRequest(policyConfig={"gpu-instance-types-allowed": config})
    )
    (diagnostic,) = analyze(analyzer, "aws:ec2/launchTemplate:LaunchTemplate", template)
    assert diagnostic.message.split("\n", 1)[1] == (
        "GPU instance type p4de.24xlarge is not allowed: use one of p3.2xlarge, "
        "or add it to the policy's allowedInstanceTypes"
    )


def test_plugin_answers_as_a_pulumi_plugin(analyzer):
    assert isinstance(analyzer.GetPluginInfo(empty_pb2.Empty()), plugin_pb2.PluginInfo)
