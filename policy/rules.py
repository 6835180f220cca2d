"""The checks behind the policy pack, as plain functions over resource types and properties.

Properties use Pulumi's names (camelCase), as both the policy engine and Pulumi's test mocks pass
them. Each check returns its violations; an empty list means compliant. A value that is unknown
during preview counts as not set: a guardrail must be visible in the program, not assumed.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from pulumi_policy.proxy import UnknownValueError

INSTANCE = "aws:ec2/instance:Instance"
SPOT_INSTANCE_REQUEST = "aws:ec2/spotInstanceRequest:SpotInstanceRequest"
LAUNCH_TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
EBS_VOLUME = "aws:ebs/volume:Volume"
BUCKETS = ("aws:s3/bucket:Bucket", "aws:s3/bucketV2:BucketV2")
BUCKET_ENCRYPTION = (
    "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration",
    "aws:s3/bucketServerSideEncryptionConfigurationV2:BucketServerSideEncryptionConfigurationV2",
)
SECURITY_GROUP = "aws:ec2/securityGroup:SecurityGroup"
SECURITY_GROUP_RULE = "aws:ec2/securityGroupRule:SecurityGroupRule"
INGRESS_RULE = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
BUDGET = "aws:budgets/budget:Budget"

INSTANCE_LIKE = (INSTANCE, SPOT_INSTANCE_REQUEST)
LAUNCHES_INSTANCES = (*INSTANCE_LIKE, LAUNCH_TEMPLATE)

# EC2's GPU families: P (training), G (graphics/inference), Gr (graphics with more memory).
_GPU_FAMILY = re.compile(r"^(p|g|gr)\d")
_ANYWHERE = ("0.0.0.0/0", "::/0")
_ALL_PROTOCOLS = ("-1", "all")
_SSH_PORT = 22
# Written from the stack's catalog by `python -m infra.knowledge.policy_allowlist`: the pack
# is published alone (`pulumi policy publish` uploads this folder only), so it keeps its own copy.
_ALLOWLIST = Path(__file__).resolve().parent / "allowed_instance_types.toml"


@dataclass(frozen=True)
class StackResource:
    """A resource of the whole stack, as the stack policies see it."""

    type: str
    name: str
    props: Mapping[str, Any]
    urn: str = ""
    id: str | None = None
    # property name -> URNs of the resources its value came from (known even during preview)
    property_dependencies: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class Violation:
    message: str
    urn: str | None = None


def get(props: Any, *path: str | int) -> Any:
    """The value at `path`, or None when any step is missing or unknown during preview."""
    value = props
    for step in path:
        try:
            if isinstance(step, int):
                value = value[step] if isinstance(value, Sequence) and step < len(value) else None
            else:
                value = value.get(step) if isinstance(value, Mapping) else None
        except UnknownValueError:
            return None
        if value is None:
            return None
    return value


def _items(props: Any, key: str) -> list[Any]:
    value = get(props, key)
    return list(value) if isinstance(value, Sequence) and not isinstance(value, str) else []


def _is_true(value: Any) -> bool:
    # Launch templates take EBS flags as strings ("true"), instances and volumes as booleans.
    return value is True or (isinstance(value, str) and value.lower() == "true")


def is_gpu_instance_type(instance_type: Any) -> bool:
    return isinstance(instance_type, str) and bool(_GPU_FAMILY.match(instance_type))


@cache
def catalog_instance_types() -> tuple[str, ...]:
    """The GPU instance types the stack's catalog knows: the default allowed list."""
    with _ALLOWLIST.open("rb") as file:
        return tuple(sorted(tomllib.load(file)["instance_types"]))


def check_imdsv2(resource_type: str, props: Mapping[str, Any]) -> list[str]:
    """Instances and launch templates must require IMDSv2 session tokens."""
    if resource_type not in LAUNCHES_INSTANCES:
        return []
    tokens = get(props, "metadataOptions", "httpTokens")
    if tokens == "required":
        return []
    if tokens is None and resource_type != LAUNCH_TEMPLATE and get(props, "launchTemplate"):
        return []  # launched from a template, which this same policy checks
    kind = "launch template" if resource_type == LAUNCH_TEMPLATE else "instance"
    return [
        f"{kind} does not require IMDSv2 (metadataOptions.httpTokens is {tokens or 'unset'}): "
        'set it to "required" so a stolen request cannot read the instance role\'s credentials'
    ]


def check_volume_encryption(resource_type: str, props: Mapping[str, Any]) -> list[str]:
    """Every EBS volume the stack declares must be encrypted."""
    if resource_type == EBS_VOLUME:
        return (
            []
            if _is_true(get(props, "encrypted"))
            else ["EBS volume is not encrypted: set encrypted to true"]
        )
    if resource_type == LAUNCH_TEMPLATE:
        return [
            f"launch template block device {get(mapping, 'deviceName') or index} is not "
            'encrypted: set ebs.encrypted to "true"'
            for index, mapping in enumerate(_items(props, "blockDeviceMappings"))
            if get(mapping, "ebs") is not None and not _is_true(get(mapping, "ebs", "encrypted"))
        ]
    if resource_type in INSTANCE_LIKE:
        violations = []
        root = get(props, "rootBlockDevice")
        if root is not None and not _is_true(get(root, "encrypted")):
            violations.append(
                "instance root volume is not encrypted: set rootBlockDevice.encrypted to true"
            )
        violations += [
            f"instance volume {get(device, 'deviceName') or index} is not encrypted: "
            "set encrypted to true in ebsBlockDevices"
            for index, device in enumerate(_items(props, "ebsBlockDevices"))
            if not _is_true(get(device, "encrypted"))
        ]
        return violations
    return []


def _opens_ssh(protocol: Any, from_port: Any, to_port: Any) -> bool:
    if str(protocol).lower() in _ALL_PROTOCOLS:
        return True
    if str(protocol).lower() not in ("tcp", "6"):
        return False
    return from_port is not None and to_port is not None and from_port <= _SSH_PORT <= to_port


def _ssh_violation(kind: str, cidrs: Iterable[Any]) -> list[str]:
    return [
        f"{kind} allows SSH (port 22) from {cidr}: connect with SSM Session Manager, "
        "or allow only your own address range"
        for cidr in cidrs
        if cidr in _ANYWHERE
    ]


def check_no_public_ssh(resource_type: str, props: Mapping[str, Any]) -> list[str]:
    """No security group may open port 22 to the whole internet (IPv4 or IPv6)."""
    if resource_type == SECURITY_GROUP:
        return [
            message
            for rule in _items(props, "ingress")
            if _opens_ssh(get(rule, "protocol"), get(rule, "fromPort"), get(rule, "toPort"))
            for message in _ssh_violation(
                "security group", [*_items(rule, "cidrBlocks"), *_items(rule, "ipv6CidrBlocks")]
            )
        ]
    if resource_type == SECURITY_GROUP_RULE:
        if get(props, "type") != "ingress" or not _opens_ssh(
            get(props, "protocol"), get(props, "fromPort"), get(props, "toPort")
        ):
            return []
        cidrs = [*_items(props, "cidrBlocks"), *_items(props, "ipv6CidrBlocks")]
        return _ssh_violation("security group rule", cidrs)
    if resource_type == INGRESS_RULE:
        if not _opens_ssh(get(props, "ipProtocol"), get(props, "fromPort"), get(props, "toPort")):
            return []
        return _ssh_violation("ingress rule", [get(props, "cidrIpv4"), get(props, "cidrIpv6")])
    return []


def check_gpu_instance_type(
    resource_type: str, props: Mapping[str, Any], allowed: Sequence[str]
) -> list[str]:
    """GPU instances (P and G families) only of the allowed types; other families pass."""
    if resource_type not in LAUNCHES_INSTANCES:
        return []
    instance_type = get(props, "instanceType")
    if not is_gpu_instance_type(instance_type) or instance_type in allowed:
        return []
    return [
        f"GPU instance type {instance_type} is not allowed: use one of {', '.join(allowed)}, "
        "or add it to the policy's allowedInstanceTypes"
    ]


def check_budget_for_gpus(resources: Sequence[StackResource]) -> list[Violation]:
    """A stack that launches GPU instances must carry an AWS Budget that notifies someone."""
    gpu_launchers = [
        resource
        for resource in resources
        if resource.type in LAUNCHES_INSTANCES
        and is_gpu_instance_type(get(resource.props, "instanceType"))
    ]
    if not gpu_launchers:
        return []
    budgets = [resource for resource in resources if resource.type == BUDGET]
    if any(_items(budget.props, "notifications") for budget in budgets):
        return []
    launchers = ", ".join(f"{r.name} ({get(r.props, 'instanceType')})" for r in gpu_launchers)
    missing = "a notification" if budgets else "an AWS Budget"
    return [
        Violation(
            f"the stack launches GPU instances [{launchers}] without {missing}: add a budget "
            "with notifications (the Guardrails component does) so spending is seen and stopped"
        )
    ]


def check_bucket_encryption(resources: Sequence[StackResource]) -> list[Violation]:
    """Every S3 bucket needs a server-side encryption configuration: inline, or its own resource."""
    configs = [resource for resource in resources if resource.type in BUCKET_ENCRYPTION]
    violations = []
    for bucket in (resource for resource in resources if resource.type in BUCKETS):
        names = {bucket.id, get(bucket.props, "bucket"), get(bucket.props, "id")} - {None}
        encrypted = get(bucket.props, "serverSideEncryptionConfiguration") is not None or any(
            bucket.urn in config.property_dependencies.get("bucket", ())
            or get(config.props, "bucket") in names
            for config in configs
        )
        if not encrypted:
            violations.append(
                Violation(
                    f"S3 bucket {bucket.name} has no server-side encryption configuration: add an "
                    "aws.s3.BucketServerSideEncryptionConfiguration for it (SSE-S3 or SSE-KMS)",
                    bucket.urn or None,
                )
            )
    return violations
