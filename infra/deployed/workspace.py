"""The deployed stack as the commands see it: Pulumi's Automation API over the user's own
Pulumi CLI (state, outputs, up, destroy), and boto3 clients in the stack's region.

`open_stack` is the one door to Pulumi; tests replace it with a stub that records
the calls. Pulumi and boto3 are imported only when a command needs them.
"""

from __future__ import annotations

import re
import shutil
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from infra.config.stack_file import REPO_ROOT
from infra.errors import ConfigError
from infra.knowledge.profiles import load_profiles
from infra.outputs import StackOutputs, read_outputs

HOW_TO_INSTALL_PULUMI = (
    "install it with `curl -fsSL https://get.pulumi.com | sh` "
    "(https://www.pulumi.com/docs/install/)"
)


def add_stack_argument(parser) -> None:
    parser.add_argument(
        "stack",
        nargs="?",
        help="stack name, as in Pulumi.STACK.yaml (default: the default profile)",
    )


# Pulumi's own rule for a stack name (pulumi/pulumi, pkg/backend/filestate/backend.go,
# ValidateStackName: ^[A-Za-z0-9_.-]{1,100}$); also what keeps Pulumi.<name>.yaml a file
# next to Pulumi.yaml.
_STACK_NAME = re.compile(r"[A-Za-z0-9_.-]{1,100}")


def stack_name(args) -> str:
    name = args.stack or load_profiles().default
    if not _STACK_NAME.fullmatch(name) or name in (".", ".."):
        raise ConfigError(
            f"stack name {name!r}: a stack name is 1 to 100 letters, digits, '-', '_' or '.' "
            f"(one of the profiles: {', '.join(load_profiles().profiles)})"
        )
    return name


def open_stack(name: str, *, create: bool = False) -> Any:
    """The project's stack `name` (a pulumi.automation.Stack), run by the installed CLI."""
    if shutil.which("pulumi") is None:
        raise ConfigError(
            f"the Pulumi CLI is not on PATH: {HOW_TO_INSTALL_PULUMI}, then run this again"
        )
    from pulumi import automation as auto

    try:
        if create:
            return auto.create_or_select_stack(stack_name=name, work_dir=str(REPO_ROOT))
        return auto.select_stack(stack_name=name, work_dir=str(REPO_ROOT))
    except auto.StackNotFoundError:
        raise ConfigError(
            f"there is no stack {name!r} in this project yet: create it with "
            f"`python -m infra up {name}`"
        ) from None


@dataclass(frozen=True)
class Deployed:
    """A stack that is up: its name, region and outputs (infra/outputs.py)."""

    name: str
    region: str
    outputs: StackOutputs
    budget_period: str = "MONTHLY"  # gpu:budgetPeriod, the spend ledger's period

    @property
    def cost_tag(self) -> tuple[str, str]:
        """(key, value) of the tag on every instance of the stack."""
        key, _, value = self.outputs.cost_tag.partition("=")
        return key, value

    @property
    def checkpoint_uri(self) -> str:
        return self.outputs.checkpoint_uri


def stack_outputs(name: str, values: Mapping[str, Any]) -> StackOutputs:
    """Stack `name`'s outputs from the Automation API's (name -> OutputValue), checked."""
    return read_outputs(name, {key: output.value for key, output in values.items()})


def deployed(name: str, stack: Any | None = None) -> Deployed:
    """The outputs and region of stack `name`; ConfigError when it is not up."""
    stack = stack if stack is not None else open_stack(name)
    values = stack.outputs()
    outputs = stack_outputs(name, values) if values else None
    if outputs is None or not outputs.has_compute:
        raise ConfigError(
            f"stack {name!r} has no instances (it is down or was never up): "
            f"`python -m infra up {name}` creates them"
        )
    return Deployed(name, stack_region(stack, name), outputs, _budget_period(stack))


def _budget_period(stack: Any) -> str:
    from pulumi import automation as auto

    try:
        return stack.get_config("gpu:budgetPeriod").value.strip().upper()
    except auto.CommandError:  # not set: the default period
        return "MONTHLY"


def stack_region(stack: Any, name: str) -> str:
    from pulumi import automation as auto

    try:
        return stack.get_config("aws:region").value
    except auto.CommandError:
        raise ConfigError(
            f"stack {name!r} sets no aws:region: `pulumi config set aws:region us-east-1 "
            f"--stack {name}`"
        ) from None


def aws(service: str, region: str) -> Any:
    """A boto3 client (credentials, and AWS_ENDPOINT_URL for a local API, from the environment)."""
    import boto3

    return boto3.client(service, region_name=region)


def printer(out=None) -> Callable[[str], None]:
    """What the Automation API streams (Pulumi's own progress lines), passed through."""
    stream = out if out is not None else sys.stdout

    def show(line: str) -> None:
        stream.write(line if line.endswith("\n") else line + "\n")
        stream.flush()

    return show


def confirm(question: str, *, yes: bool, ask: Callable[[str], str] | None, what: str) -> bool:
    """True when --yes was given or the person answers y; never guesses without a terminal."""
    if yes:
        return True
    if ask is None:
        if not sys.stdin.isatty():
            raise ConfigError(f"{what} needs a yes: no terminal to ask on, so pass --yes")
        ask = input
    return ask(f"{question} [y/N] ").strip().lower() in ("y", "yes")


def chunks(items: Sequence, size: int) -> list[Sequence]:
    return [items[start : start + size] for start in range(0, len(items), size)]
