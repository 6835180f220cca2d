"""Run the real Pulumi program, or a piece of one, offline: no Pulumi CLI, AWS account or keys.

`run_program(config)` executes the repository's `__main__.py` under `pulumi.runtime.set_mocks`
(infra.dryrun.mocks.RecordingMocks), records every resource it registers (type, name, inputs,
provider, the options that order creation and replacement) and resolves the stack outputs.
`run_under_mocks(program)` does the same for any callable that builds resources. The tests
assert on these recordings; `python -m infra plan --resources` prints them (infra.dryrun.report).
"""

from __future__ import annotations

import json
import logging
import os
import runpy
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi

from infra.config.stack_file import REPO_ROOT, config_text, stack_file_config
from infra.dryrun.mocks import PLACEHOLDER_REGION, Recorded, RecordingMocks
from infra.preflight.quotas import OFFLINE_ENV

PROGRAM = REPO_ROOT / "__main__.py"
PROJECT = "gpu-training-stack"


@dataclass
class ProgramRun:
    resources: list[Recorded]
    outputs: dict[str, Any]
    # "type name" -> the names of the resources it was told to wait for (depends_on)
    depends_on: dict[str, list[str]] = field(default_factory=dict)
    # "type name" of the resources that are deleted before their replacement is created
    delete_before_replace: set[str] = field(default_factory=set)
    # "type name" of the resources `pulumi destroy` leaves in the account
    retain_on_delete: set[str] = field(default_factory=set)
    # "type name" -> the earlier names Pulumi also knows it by (aliases: no replacement)
    aliases: dict[str, list[str]] = field(default_factory=dict)

    @property
    def retain_on_delete_names(self) -> set[str]:
        return {key.split(" ", 1)[1] for key in self.retain_on_delete}


def run_under_mocks(
    program: Callable[[], Any],
    *,
    config: Mapping[str, str],
    mocks: RecordingMocks,
    stack: str,
) -> tuple[ProgramRun, Any]:
    """Run `program` under `mocks` with `config` (full keys, e.g. "gpu:nodes") until every
    resource it started is registered: (the run, the program's return value)."""
    os.environ[OFFLINE_ENV] = "1"  # the program makes no AWS call of its own (preflight)
    # As the Pulumi language host hands a program its config (infra/components/stack_config.py).
    os.environ["PULUMI_CONFIG"] = json.dumps(dict(config))
    pulumi.runtime.reset_options(project=PROJECT, stack=stack, preview=False)
    pulumi.runtime.set_mocks(
        mocks, project=PROJECT, stack=stack, preview=False, logger=_QUIET_ENGINE
    )
    depends_on: dict[str, list[str]] = {}
    delete_first: set[str] = set()
    retained: set[str] = set()
    aliases: dict[str, list[str]] = {}

    def record_options(
        args: pulumi.ResourceTransformationArgs,
    ) -> pulumi.ResourceTransformationResult | None:
        """Mocks see inputs only: the options that order creation and replacement are read here."""
        key = f"{args.type_} {args.name}"
        waits = args.opts.depends_on if args.opts is not None else None
        if waits:
            waits = waits if isinstance(waits, list) else [waits]
            depends_on[key] = [r.pulumi_resource_name for r in waits]
        if args.opts is not None and args.opts.delete_before_replace:
            delete_first.add(key)
        if args.opts is not None and args.opts.retain_on_delete:
            retained.add(key)
        if args.opts is not None and args.opts.aliases:
            aliases[key] = [
                alias if isinstance(alias, str) else alias.name for alias in args.opts.aliases
            ]
        return None

    result: list[Any] = []

    @pulumi.runtime.test
    def run() -> pulumi.Output:
        pulumi.runtime.register_stack_transformation(record_options)
        result.append(program())
        return pulumi.Output.from_input(None)

    run()
    run = ProgramRun(list(mocks.resources), {}, depends_on, delete_first, retained, aliases)
    return run, result[0]


def run_program(
    config: Mapping[str, Any],
    *,
    stack: str = "offline",
    mocks: RecordingMocks | None = None,
    aws_region: str | None = None,
) -> ProgramRun:
    """Run __main__.py once under mocks with the given config (keys with or without "gpu:").

    Raises what the program raises: pulumi.RunError for bad config.
    """
    region = aws_region or (mocks.region if mocks else PLACEHOLDER_REGION)
    mocks = mocks if mocks is not None else RecordingMocks(region=region)
    settings = {"aws:region": region}
    settings.update({(k if ":" in k else f"gpu:{k}"): config_text(v) for k, v in config.items()})

    def program() -> dict[str, Any]:
        runpy.run_path(str(PROGRAM), run_name="__main__")
        return pulumi.runtime.get_root_resource().outputs

    run, outputs = run_under_mocks(program, config=settings, mocks=mocks, stack=stack)
    run.outputs = _resolved(outputs)
    return run


def _resolved(outputs: Mapping[str, Any]) -> dict[str, Any]:
    """The stack outputs' values, once the mocks have settled them."""
    values: dict[str, Any] = {}

    @pulumi.runtime.test
    def read() -> pulumi.Output:
        return pulumi.Output.from_input(dict(outputs)).apply(values.update)

    read()
    return values


# The program's warnings reach the run's outputs (and the plan `--resources` prints);
# keep the mock engine's own log quiet instead of printing them a second time.
_QUIET_ENGINE = logging.getLogger("infra.dryrun.engine")
_QUIET_ENGINE.addHandler(logging.NullHandler())
_QUIET_ENGINE.propagate = False


def run_stack_file(path: Path) -> ProgramRun:
    """Run the program with a stack file's config (stack name from Pulumi.<stack>.yaml)."""
    config = stack_file_config(path)
    stack = path.name.removeprefix("Pulumi.").removesuffix(".yaml")
    return run_program(config, stack=stack, aws_region=config.get("aws:region"))
