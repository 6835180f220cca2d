"""The Pulumi program: read the `gpu:` config, resolve it, build the training stack.

Every check runs before the first resource: a bad key or value stops
`pulumi preview` with one sentence (no traceback) naming the key, the value and
what would work. docs/stack.md lists the keys.
"""

import pulumi

from infra.components.stack import TrainingStack
from infra.config.schema import config_from_pulumi, load_stack_config, stack_region
from infra.errors import ConfigError

try:
    config = load_stack_config(config_from_pulumi(pulumi.Config("gpu")))
    plan = config.resolve_plan(stack_region(pulumi.Config("aws").get("region")))
    config.check_plan(plan)
    for warning in (*plan.warnings, *config.guardrails.warnings):
        pulumi.log.warn(warning)
    stack = TrainingStack(f"{pulumi.get_project()}-{pulumi.get_stack()}", config, plan)
except ConfigError as error:
    raise pulumi.RunError(str(error)) from None

for key, value in stack.outputs.items():
    pulumi.export(key, value)
