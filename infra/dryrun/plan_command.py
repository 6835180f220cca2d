"""`plan --resources` of `python -m infra`: run the program offline and list its resources."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from infra.config.stack_file import load_stack_file, stack_file_path, stack_file_region
from infra.errors import ConfigError
from infra.knowledge.profiles import load_profiles

Command = tuple[Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], str]]


def with_resources(add_arguments: Callable, run: Callable) -> Command:
    """The `plan` command plus `--resources`: list what `pulumi up` would create.

    `python -m infra plan NAME --resources` runs the program with the config of
    the stack file Pulumi.NAME.yaml (NAME defaults to the default profile);
    `--stack-file PATH` names another one. It prints that config's plan and costs
    (`describe_stack`), then the resources (`describe_run`).
    """

    def add(parser: argparse.ArgumentParser) -> None:
        add_arguments(parser)
        parser.add_argument(
            "--resources",
            action="store_true",
            help="run the Pulumi program offline (mocks, no AWS) with the stack file "
            "Pulumi.PROFILE.yaml and list the resources it creates",
        )
        parser.add_argument(
            "--stack-file", type=Path, help="with --resources: the stack file to run"
        )

    def run_command(args: argparse.Namespace) -> str:
        if args.stack_file is not None and not args.resources:
            raise ConfigError("--stack-file goes with --resources")
        if not args.resources:
            return run(args)
        if args.instance or args.variant is not None or args.nodes is not None:
            raise ConfigError(
                "--resources runs a stack file: set gpu:instanceType, gpu:imageVariant or "
                "gpu:nodes there instead of --instance, --variant or --nodes"
            )
        path = args.stack_file or stack_file_path(args.profile or _default_stack())
        if not path.is_file():
            with_files = [
                name for name in load_profiles().profiles if stack_file_path(name).is_file()
            ]
            raise ConfigError(
                f"no stack file {path}: give a profile with a Pulumi.<profile>.yaml "
                f"({', '.join(with_files)}) or --stack-file PATH"
            )
        # Pulumi is imported only here: plain `plan` runs without it (tests/infra/dryrun).
        import pulumi

        from infra.dryrun.mocks import PLACEHOLDER_REGION
        from infra.dryrun.report import describe_run, describe_stack
        from infra.dryrun.runner import run_stack_file

        try:
            run_result = run_stack_file(path)  # checks every key and value first
        except pulumi.RunError as exc:
            raise ConfigError(f"{path.name}: {exc}") from None
        return "\n".join(
            [
                f"stack file     {path.name}",
                # Priced where the offline run ran (a placeholder region without aws:region).
                describe_stack(
                    load_stack_file(path), stack_file_region(path) or PLACEHOLDER_REGION
                ),
                "",
                describe_run(run_result),
            ]
        )

    return add, run_command


def _default_stack() -> str:
    return load_profiles().default
