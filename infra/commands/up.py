"""`up [STACK]` and `preview [STACK]`: the stack file's plan and costs, then Pulumi's own
`up` (after a yes) or `preview`, through the Automation API and the installed Pulumi CLI.

Everything is checked offline first (the stack file's keys, the plan, the guardrails,
gpu:trainConfig), so a bad value stops here in one line, before Pulumi starts; `up` then
checks what renting needs (the Pulumi CLI, AWS credentials, the region, the EC2 quota:
doctor's checks) before it asks whether to spend.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable

from infra import targets
from infra.commands.doctor import Probes, renting_checks
from infra.config.schema import StackConfig, stack_region
from infra.config.stack_file import (
    REPO_ROOT,
    load_stack_file,
    stack_file_path,
    stack_file_region,
)
from infra.deployed import workspace
from infra.errors import ConfigError
from infra.jobs import hf_token
from infra.knowledge.costs import cost_summary, hourly_usd
from infra.knowledge.resolver import Plan
from infra.planning import check_plan, resolve_plan
from infra.project import project_name, stack_resource_name
from infra.report import format_cost_table

# The project's guardrail policies (policy/): Pulumi runs them at preview and up and fails on
# a mandatory violation (Pulumi docs, "Policy as code": --policy-pack).
POLICY_PACK = REPO_ROOT / "policy"


def add_preview_arguments(parser: argparse.ArgumentParser) -> None:
    workspace.add_stack_argument(parser)
    parser.add_argument(
        "--no-policy-pack",
        dest="policy_pack",
        action="store_false",
        help="do not run the guardrail policy pack (policy/)",
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_preview_arguments(parser)
    parser.add_argument("--yes", "-y", action="store_true", help="create without asking")


def _policy_packs(args: argparse.Namespace) -> list[str]:
    return [str(POLICY_PACK)] if args.policy_pack else []


def _checked(name: str) -> tuple[StackConfig, Plan]:
    path = stack_file_path(name)
    config = load_stack_file(path)
    plan = resolve_plan(config, stack_region(stack_file_region(path)))
    try:
        check_plan(config, plan)
        targets.deployment(name, config, plan).check()
    except ConfigError as exc:
        raise ConfigError(f"{path.name}: {exc}") from None
    return config, plan


def describe(name: str, config: StackConfig, plan: Plan) -> str:
    lines = [
        f"stack       {name}: {plan.nodes} x {plan.instance.type} ({plan.gpus} x "
        f"{plan.instance.gpu_model} {plan.instance.gpu_memory_gib} GiB), "
        f"{config.market}",
        f"image       {config.image_tag or plan.image_tag} ({plan.variant.name}), AMI "
        f"{plan.ami.name} (driver {plan.ami.driver_version})",
        "",
        format_cost_table(cost_summary(plan, config.guardrails, market=config.market)),
    ]
    lines += [f"warning     {warning}" for warning in (*plan.warnings, *config.guardrails.warnings)]
    return "\n".join(lines)


def run_preview(args: argparse.Namespace, *, out=None) -> str:
    """What `up` would change, from Pulumi's own preview (nothing is created)."""
    out = out or sys.stdout
    name = workspace.stack_name(args)
    config, plan = _checked(name)
    out.write(describe(name, config, plan) + "\n\n")
    stack = workspace.open_stack(name, create=True)
    result, note = targets.deployment(name, config, plan).preview(
        stack, say=workspace.printer(out), policy_packs=_policy_packs(args)
    )
    # change_summary maps Pulumi's OpType (a str enum: "create", "update", ...) to counts.
    changes = ", ".join(
        f"{count} to {getattr(op, 'value', op)}"
        for op, count in result.change_summary.items()
        if getattr(op, "value", op) != "same"
    )
    line = f"preview of {name}: {changes or 'no changes'}"
    if note:
        line += f"; {note}"
    return line


def _ready_to_rent(name: str, config: StackConfig, plan: Plan, probes: Probes, out) -> None:
    """Refuse, in one line, a stack `up` could not create: asking first would only waste the
    yes. A check that cannot tell (a quota it cannot read) is shown and does not stop it."""
    region = stack_file_region(stack_file_path(name))
    for check in renting_checks(probes, plan=plan, market=config.market, region=region):
        if check.status == "FAIL":
            raise ConfigError(f"{check.finding}: {check.fix}; nothing was created")
        if check.status == "warn":
            out.write(f"warning     {check.name}: {check.finding}; {check.fix}\n")


def run(
    args: argparse.Namespace,
    *,
    out=None,
    ask: Callable[[str], str] | None = None,
    probes: Probes | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> str:
    """Show the plan's costs, check what renting needs, ask, then create or update the stack.

    Pulumi's up does the work. The stack kind's deployment (infra/targets/) says what the change
    needs before the question, and does what the kind needs around Pulumi's up (a cluster's
    update may stop its compute fleet: infra/deployed/cluster_update.py)."""
    out = out or sys.stdout
    say = workspace.printer(out)
    name = workspace.stack_name(args)
    config, plan = _checked(name)
    _ready_to_rent(name, config, plan, probes or Probes(), out)
    out.write(describe(name, config, plan) + "\n\n")
    deployment = targets.deployment(name, config, plan)
    stack = deployment.prepare(
        lambda: workspace.open_stack(name, create=True), say=say, policy_packs=_policy_packs(args)
    )
    hourly = hourly_usd(plan, config.market)
    question = f"Create or update stack {name} at ${hourly:,.2f}/h ({config.market}) while it runs?"
    if not workspace.confirm(question, yes=args.yes, ask=ask, what=f"up {name}"):
        return "nothing was created"
    stack = stack or workspace.open_stack(name, create=True)
    # Before the nodes boot: the default job reads it at its start.
    secrets = workspace.aws(
        "secretsmanager", stack_region(stack_file_region(stack_file_path(name)))
    )
    stored = hf_token.store(
        secrets, hf_token.secret_name(stack_resource_name(project_name(), name)), os.environ
    )
    if stored:
        say(stored)

    def pulumi_up():
        return stack.up(on_output=say, color="never", policy_packs=_policy_packs(args))

    result = deployment.up(stack, pulumi_up, say=say, sleep=sleep)
    outputs = workspace.stack_outputs(name, result.outputs)
    if not outputs.has_compute:  # its kind makes the nodes once their image is pushed
        return "\n".join(
            [
                f"stack {name} is ready for its image, and rents no GPU yet: push "
                f"{outputs.image_uri} (README, Running on AWS: `python -m images build`), then",
                f"`python -m infra up {name}` again creates the nodes",
            ]
        )
    region = stack_region(stack_file_region(stack_file_path(name)))
    nodes = targets.open_target(workspace.Deployed(name, region, outputs)).up_summary()
    return "\n".join(
        [
            f"stack {name} is up: {nodes}",
            f"image it waits for: {outputs.image_uri} (push it: docs/stack.md)",
            f"next: `python -m infra status {name}`, `python -m infra logs {name} --follow`",
        ]
    )
