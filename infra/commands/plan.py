"""`plan [PROFILE]`: what a profile (or an instance type) resolves to and what it costs.

`--resources` runs the real Pulumi program offline (infra/dryrun) with the stack
file Pulumi.PROFILE.yaml and lists what `pulumi up` would create; without it no
Pulumi module is imported.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from images.matrix import load_matrix
from infra.config.stack_file import load_stack_file, stack_file_path, stack_file_region
from infra.errors import ConfigError
from infra.knowledge.catalog import Catalog, load_catalog
from infra.knowledge.costs import cost_summary
from infra.knowledge.parallelcluster import load_parallelcluster
from infra.knowledge.profiles import load_profiles, resolve_profile
from infra.knowledge.resolver import AUTO, DEFAULT_PLAN_REGION, MAX_NODES, Plan, resolve
from infra.planning import memory_line, resolve_plan
from infra.report import format_cluster, format_costs, format_plan


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "profile", nargs="?", help="profile name from infra/knowledge/data/profiles.toml"
    )
    parser.add_argument("--instance", help="instance type instead of a profile")
    parser.add_argument("--variant", default=None, help=f"image variant (default {AUTO})")
    parser.add_argument(
        "--nodes",
        type=int,
        default=None,
        help="number of nodes (default 1); more than 1 plans a Slurm cluster (gpu:cluster)",
    )
    parser.add_argument(
        "--parallelcluster",
        metavar="VERSION",
        help="plan a Slurm cluster of this ParallelCluster release (default: the newest known)",
    )
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
    parser.add_argument(
        "--resources",
        action="store_true",
        help="run the Pulumi program offline (mocks, no AWS) with the stack file "
        "Pulumi.PROFILE.yaml and list the resources it creates",
    )
    parser.add_argument("--stack-file", type=Path, help="with --resources: the stack file to run")


def run(args: argparse.Namespace) -> str:
    """The resolved plan of a profile or instance type, its $/h and runway (offline)."""
    if args.stack_file is not None and not args.resources:
        raise ConfigError("--stack-file goes with --resources")
    if args.resources:
        return _resources(args)
    if args.profile and args.instance:
        raise ConfigError("give a profile or --instance, not both")
    matrix = load_matrix(args.matrix)
    _check_flags(args, matrix)
    catalog = load_catalog(args.catalog)
    profiles = load_profiles(args.profiles)
    if (args.nodes is not None and args.nodes > 1) or args.parallelcluster:
        return _run_cluster_plan(args, profiles, catalog, matrix)
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
        raise ConfigError(
            "--variant and --nodes 1 go with --instance; a profile sets its own "
            "(--nodes above 1 plans a Slurm cluster for the profile)"
        )
    name = args.profile or profiles.default
    path = stack_file_path(name)
    in_file = stack_file_region(path) if path.is_file() else None
    region = _region(args.region or in_file, catalog)
    plan = resolve_profile(name, profiles=profiles, catalog=catalog, matrix=matrix, region=region)
    report = format_plan(plan, profile=profiles.get(name), rate=profiles.exchange_rate)
    costs = _stack_file_costs(name, plan)
    return report if costs is None else f"{report}\n{costs}"


def _check_flags(args: argparse.Namespace, matrix) -> None:
    """--nodes and --variant checked as typed, before what they combine with."""
    if args.nodes is not None and not 1 <= args.nodes <= MAX_NODES:
        raise ConfigError(f"--nodes {args.nodes}: give a whole number from 1 to {MAX_NODES}")
    if args.variant is not None and args.variant != AUTO and args.variant not in matrix.names:
        raise ConfigError(
            f"--variant {args.variant!r}: unknown image variant (known: "
            f"{', '.join(matrix.names)}, or {AUTO})"
        )


def _run_cluster_plan(args: argparse.Namespace, profiles, catalog, matrix) -> str:
    """More than one node: the profile's (or --instance's) type as a Slurm cluster's queue."""
    parallelcluster = load_parallelcluster()
    release = parallelcluster.release(args.parallelcluster)
    profile = None if args.instance else profiles.get(args.profile or profiles.default)
    if profile is not None and args.variant is not None:
        raise ConfigError("--variant goes with --instance; a profile sets its own")
    plan = resolve(
        args.instance or profile.instance_type,
        args.variant or AUTO,  # picked for the release's driver, not the EC2 path's AMIs
        args.nodes if args.nodes is not None else 1,
        catalog=catalog,
        matrix=matrix,
        region=_region(args.region, catalog),
        cluster=release,
    )
    report = format_plan(plan, profile=profile, rate=profiles.exchange_rate)
    return f"{report}\n{format_cluster(plan, parallelcluster)}"


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
    stack_plan = resolve_plan(stack, plan.price.region)
    # Compared by what runs, not by prices: with --catalog the plan may carry other prices.
    if _runs(stack_plan) != _runs(plan):
        return (
            f"stack file     {path.name} runs {stack_plan.nodes} x {stack_plan.instance.type} "
            f"({stack_plan.variant.name}): `python -m infra plan {profile} --resources` "
            "prices that stack"
        )
    summary = cost_summary(plan, stack.guardrails, market=stack.market)
    lines = [f"stack file     {path.name}", format_costs(summary)]
    memory = memory_line(stack, stack_plan)
    if memory is not None:
        lines.append(f"memory         {memory}")
    return "\n".join(lines)


def _runs(plan: Plan) -> tuple[str, int, str]:
    return plan.instance.type, plan.nodes, plan.variant.name


def _resources(args: argparse.Namespace) -> str:
    """`--resources`: the stack file's plan and costs, then every resource it creates."""
    if args.instance or args.variant is not None or args.nodes is not None:
        raise ConfigError(
            "--resources runs a stack file: set gpu:instanceType, gpu:imageVariant or "
            "gpu:nodes there instead of --instance, --variant or --nodes"
        )
    path = args.stack_file or stack_file_path(args.profile or load_profiles().default)
    if not path.is_file():
        with_files = [name for name in load_profiles().profiles if stack_file_path(name).is_file()]
        raise ConfigError(
            f"no stack file {path}: give a profile with a Pulumi.<profile>.yaml "
            f"({', '.join(with_files)}) or --stack-file PATH"
        )
    # Pulumi is imported only here: plain `plan` runs without it (tests/infra/test_cli.py).
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
            describe_stack(load_stack_file(path), stack_file_region(path) or PLACEHOLDER_REGION),
            "",
            describe_run(run_result),
        ]
    )
