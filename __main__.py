"""The Pulumi program: read the `gpu:` config, resolve it, build the training stack.

Every check runs before the first resource: a bad key or value stops
`pulumi preview` with one sentence (no traceback) naming the key, the value and
what would work. docs/stack.md lists the keys.
"""

import pulumi

from infra.components.stack import TrainingStack
from infra.components.stack_config import namespace_config
from infra.config.schema import load_stack_config
from infra.errors import ConfigError

try:
    config = load_stack_config(namespace_config("gpu"))
    plan = config.resolve_plan()
    config.check_plan(plan)
    for warning in (*plan.warnings, *config.guardrails.warnings):
        pulumi.log.warn(warning)
    stack = TrainingStack(f"{pulumi.get_project()}-{pulumi.get_stack()}", config, plan)
except ConfigError as error:
    raise pulumi.RunError(str(error)) from None

for key, value in stack.outputs.items():
    pulumi.export(key, value)
