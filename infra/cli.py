"""Command line for the infra side: `python -m infra plan [PROFILE]`.

Each subcommand registers itself in `COMMANDS` (name -> (add_arguments, run));
a new mode adds one entry. Bad input ends in a one-line error and exit 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from images.matrix import MatrixError, load_matrix
from infra.config.stack_file import load_stack_file, stack_file_path, stack_file_region
from infra.errors import ConfigError
from infra.knowledge import price_refresh
from infra.knowledge.catalog import Catalog, load_catalog
from infra.knowledge.costs import cost_summary
from infra.knowledge.profiles import load_profiles, resolve_profile
from infra.knowledge.resolver import AUTO, DEFAULT_PLAN_REGION, Plan, resolve
from infra.report import format_costs, format_plan

EXIT_BAD_INPUT = 2


class _OneLineParser(argparse.ArgumentParser):
    """argparse that reports a usage error in one line (and exit 2), like every other error."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise ConfigError(f"{self.prog}: {message}")


def _add_plan_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "profile", nargs="?", help="profile name from infra/knowledge/data/profiles.toml"
    )
    parser.add_argument("--instance", help="instance type instead of a profile")
    parser.add_argument("--variant", default=None, help=f"image variant (default {AUTO})")
    parser.add_argument("--nodes", type=int, default=None, help="number of nodes (default 1)")
    parser.add_argument(
        "--matrix", type=Path, help="image matrix file (default images/matrix.toml)"
    )
    parser.add_argument("--catalog", type=Path, help="catalog directory (default infra/catalog)")
    parser.add_argument(
        "--profiles", type=Path, help="profiles file (default infra/knowledge/data/profiles.toml)"
    )
    parser.add_argument(
        "--region",
        help=f"price for this AWS region (default: the stack file's aws:region, else "
        f"{DEFAULT_PLAN_REGION})",
    )


def _run_plan(args: argparse.Namespace) -> str:
    if args.profile and args.instance:
        raise ConfigError("give a profile or --instance, not both")
    matrix = load_matrix(args.matrix)
    catalog = load_catalog(args.catalog)
    profiles = load_profiles(args.profiles)
    if args.instance:
        plan = resolve(
            args.instance,
            args.variant or AUTO,
            args.nodes if args.nodes is not None else 1,
            catalog=catalog,
            matrix=matrix,
            region=_region(args.region, catalog),
        )
        return format_plan(plan, profile=None, rate=profiles.exchange_rate)
    if args.variant is not None or args.nodes is not None:
        raise ConfigError("--variant and --nodes go with --instance; a profile sets its own")
    name = args.profile or profiles.default
    path = stack_file_path(name)
    in_file = stack_file_region(path) if path.is_file() else None
    region = _region(args.region or in_file, catalog)
    plan = resolve_profile(name, profiles=profiles, catalog=catalog, matrix=matrix, region=region)
    report = format_plan(plan, profile=profiles.get(name), rate=profiles.exchange_rate)
    costs = _stack_file_costs(name, plan)
    return report if costs is None else f"{report}\n{costs}"


def _region(region: str | None, catalog: Catalog) -> str:
    """The region to price for, refused in one sentence when the catalog has no prices there."""
    region = region or DEFAULT_PLAN_REGION
    try:
        catalog.prices.region(region)
    except ConfigError as exc:
        raise ConfigError(f"region {region!r}: {exc}") from None
    return region


def _stack_file_costs(profile: str, plan: Plan) -> str | None:
    """The cost summary with the budget and market of the profile's Pulumi.<profile>.yaml.

    None without that file; a note when the file runs another plan (gpu:instanceType,
    gpu:nodes, ...): `--resources` prices that one.
    """
    path = stack_file_path(profile)
    if not path.is_file():
        return None
    stack = load_stack_file(path)
    stack_plan = stack.resolve_plan(plan.price.region)
    # Compared by what runs, not by prices: with --catalog the plan may carry other prices.
    if _runs(stack_plan) != _runs(plan):
        return (
            f"stack file     {path.name} runs {stack_plan.nodes} x {stack_plan.instance.type} "
            f"({stack_plan.variant.name}): `python -m infra plan {profile} --resources` "
            "prices that stack"
        )
    summary = cost_summary(plan, stack.guardrails, spot=stack.spot)
    return f"stack file     {path.name}\n{format_costs(summary)}"


def _runs(plan: Plan) -> tuple[str, int, str]:
    return plan.instance.type, plan.nodes, plan.variant.name


COMMANDS: dict[
    str, tuple[Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], str]]
] = {
    "plan": (_add_plan_arguments, _run_plan),
    "prices": (price_refresh.add_arguments, price_refresh.run),
}


def main(argv: list[str] | None = None) -> int:
    parser = _OneLineParser(prog="python -m infra", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_OneLineParser)
    for name, (add_arguments, _) in COMMANDS.items():
        add_arguments(commands.add_parser(name))
    try:
        args = parser.parse_args(argv)
        output = COMMANDS[args.command][1](args)
    except (ConfigError, MatrixError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(output)
    return 0
