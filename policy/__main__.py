"""Policy pack for GPU training stacks: `pulumi preview --policy-pack policy`.

Every policy is mandatory: a violation fails the preview. The GPU instance types allowed default to
the stack's catalog, copied into allowed_instance_types.toml beside this file (written by
`python -m infra.knowledge.policy_allowlist`); narrow or widen them with
`--policy-pack-config policy-config.json`, e.g.
{"gpu-instance-types-allowed": {"allowedInstanceTypes": ["p4d.24xlarge"]}}.
The checks themselves live in rules.py, as plain functions.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import rules  # the pack runs with this folder first on sys.path
from pulumi_policy import (
    EnforcementLevel,
    PolicyConfigSchema,
    PolicyPack,
    ReportViolation,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)

ResourceCheck = Callable[[str, Mapping[str, Any]], list[str]]
StackCheck = Callable[[list[rules.StackResource]], list[rules.Violation]]


def resource_policy(name: str, description: str, check: ResourceCheck) -> ResourceValidationPolicy:
    def validate(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
        for message in check(args.resource_type, args.props):
            report_violation(message, None)

    return ResourceValidationPolicy(name=name, description=description, validate=validate)


def stack_policy(name: str, description: str, check: StackCheck) -> StackValidationPolicy:
    def validate(args: StackValidationArgs, report_violation: ReportViolation) -> None:
        resources = [
            rules.StackResource(
                type=resource.resource_type,
                name=resource.name,
                props=resource.props,
                urn=resource.urn,
                property_dependencies={
                    prop: tuple(dependency.urn for dependency in dependencies)
                    for prop, dependencies in resource.property_dependencies.items()
                },
            )
            for resource in args.resources
        ]
        for violation in check(resources):
            report_violation(violation.message, violation.urn)

    return StackValidationPolicy(name=name, description=description, validate=validate)


def _validate_gpu_types(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
    allowed = args.get_config().get("allowedInstanceTypes") or rules.catalog_instance_types()
    for message in rules.check_gpu_instance_type(args.resource_type, args.props, allowed):
        report_violation(message, None)


POLICIES = [
    stack_policy(
        "gpu-budget-required",
        "A stack with GPU instances carries an AWS Budget with notifications.",
        rules.check_budget_for_gpus,
    ),
    resource_policy(
        "imdsv2-required",
        "Instances and launch templates require IMDSv2 (httpTokens: required).",
        rules.check_imdsv2,
    ),
    resource_policy(
        "ebs-encrypted",
        "EBS volumes and launch template block devices are encrypted.",
        rules.check_volume_encryption,
    ),
    stack_policy(
        "s3-bucket-encrypted",
        "Every S3 bucket has a server-side encryption configuration.",
        rules.check_bucket_encryption,
    ),
    resource_policy(
        "no-public-ssh",
        "No security group opens SSH (port 22) to 0.0.0.0/0 or ::/0.",
        rules.check_no_public_ssh,
    ),
    ResourceValidationPolicy(
        name="gpu-instance-types-allowed",
        description="GPU instances only of the allowed types (default: the repository's catalog).",
        validate=_validate_gpu_types,
        config_schema=PolicyConfigSchema(
            properties={
                "allowedInstanceTypes": {
                    "type": "array",
                    "items": {"type": "string"},
                    "default": list(rules.catalog_instance_types()),
                }
            }
        ),
    ),
]

if __name__ == "__main__":
    PolicyPack(
        name="gpu-training-guardrails",
        policies=POLICIES,
        enforcement_level=EnforcementLevel.MANDATORY,
    )
