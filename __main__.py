"""The Pulumi program: read the `gpu:` config, resolve it, build the training stack.

Every check runs before the first resource: a bad key or value stops
`pulumi preview` with one sentence (no traceback) naming the key, the value and
what would work. docs/stack.md lists the keys.
"""

import pulumi

from infra.components.cluster_stack import ClusterStack
from infra.components.single_node import SingleNodeStack
from infra.components.stack import StackArgs
from infra.components.stack_config import namespace_config, provider_settings
from infra.config.schema import load_stack_config, stack_region
from infra.errors import ConfigError
from infra.knowledge.quotas import quota_need
from infra.planning import check_plan, resolve_plan
from infra.preflight import quotas
from infra.project import stack_resource_name

try:
    config = load_stack_config(namespace_config("gpu"))
    # The aws: settings, read once: the region here, all of them by the stack's provider.
    aws_settings = provider_settings(namespace_config("aws"))
    plan = resolve_plan(config, stack_region(aws_settings.get("region")))
    check_plan(config, plan)
    # Refuses a stack the account's vCPU quota cannot run, before any resource exists.
    checked = quotas.preflight_quota(
        quota_need(plan, config.market),
        region=aws_settings.get("region"),
        profile=aws_settings.get("profile"),
    )
    if checked:
        pulumi.log.info(checked)
    for warning in (*plan.warnings, *config.guardrails.warnings):
        pulumi.log.warn(warning)
    kind = ClusterStack if config.cluster is not None else SingleNodeStack
    stack = kind(
        stack_resource_name(pulumi.get_project(), pulumi.get_stack()),
        StackArgs(config, plan, aws_settings),
    )
except ConfigError as error:
    raise pulumi.RunError(str(error)) from None

# One export per field of the outputs contract (infra/outputs.py) this kind of stack writes.
for name, value in stack.outputs.present().items():
    pulumi.export(name, value)
