"""`run STACK --config JOB.toml [--code DIR] [--name NAME] [--set k=v ...]`: a job on a
running stack, without replacing a node.

The job is checked first, by the trainer's own start-up checks against the stack's GPUs
(as `preview` checks gpu:trainConfig), so a job the trainer would refuse never reaches a
node. The stack's target (infra/targets/) queues it: the job spool a single node reads, or
sbatch on a Slurm cluster's head node. A name already used resumes that job from its
checkpoints.
"""

from __future__ import annotations

import argparse
import datetime
import io
import os
import tarfile
from collections.abc import Sequence
from pathlib import Path

from infra import targets
from infra.config.schema import stack_region
from infra.config.stack_file import load_stack_file, stack_file_path, stack_file_region
from infra.deployed import workspace
from infra.errors import ConfigError
from infra.jobs import spool
from infra.jobs.code_check import check_code, code_files
from infra.jobs.spool import JobSpec
from infra.knowledge.resolver import Plan
from infra.planning import check_plan, resolve_plan
from training.spec.config import add_overrides_argument, load_config, validate

# A spool object, not user data, carries the code; still, a folder this large is a data
# set or a virtual environment by mistake.
MAX_CODE_BYTES = 50 * 1024 * 1024


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.usage = (
        "%(prog)s [STACK] [--code DIR] [--name NAME] (--config JOB.toml [--set KEY=VALUE ...] "
        "| -- COMMAND ...)"
    )
    parser.epilog = (
        "-- COMMAND: any command as the job, on every node, in the stack's image: e.g. "
        "`run STACK --code ./my-project -- torchrun --nproc-per-node 8 train.py "
        "--lr 3e-4`. It gets the rendezvous (MASTER_ADDR, NODE_RANK, ... and torchrun's), "
        "CHECKPOINT_DIR and DATA_PATH, and SIGTERM on a stop; exit 75 runs it again later "
        "(docs/command-jobs.md)."
    )
    workspace.add_stack_argument(parser)
    parser.add_argument("--config", type=Path, help="the job's training TOML")
    parser.add_argument(
        "--code",
        type=Path,
        metavar="DIR",
        help="a folder shipped with the job and importable in the container "
        "(package.module:function builders; its requirements.txt is installed at start)",
    )
    parser.add_argument(
        "--name",
        help="the job's name (default: the config file's name; a command's --code folder or "
        "program)",
    )
    add_overrides_argument(
        parser, help="a training setting over the config's, as `python -m training --set` takes it"
    )


def run(args: argparse.Namespace) -> str:
    """Start a job on a running stack: the node picks it up, no new node (--code DIR)."""
    command = tuple(getattr(args, "job_command", None) or ())
    stack_name = workspace.stack_name(args)
    if command:
        if args.config is not None or args.overrides:
            raise ConfigError(
                "--config/--set and -- COMMAND: give one (the trainer's job, or your command)"
            )
        # Named after its project folder, else its program: `jobs` and `cancel` use the name.
        default = args.code.resolve().name if args.code is not None else Path(command[0]).name
        name, config_toml, plan = spool.check_name(args.name or default), "", None
    elif args.config is None:
        raise ConfigError(
            "give the job: --config JOB.toml (the trainer) or -- COMMAND ... "
            "(any command, e.g. -- torchrun train.py)"
        )
    else:
        name = spool.check_name(args.name or args.config.stem)
        plan = check_job(stack_name, args.config, args.overrides)
        config_toml = args.config.read_text()
    archive = None
    if args.code is not None:
        if not args.code.is_dir():
            raise ConfigError(
                f"--code {args.code}: not a folder (give the folder holding your package)"
            )
        if args.config is not None:  # a trainer job: its builder and requirements, checked here
            variant = plan.variant if plan is not None else None
            check_code(args.code, load_config(args.config, args.overrides), variant)
        archive = code_archive(args.code)
    target = targets.target(stack_name)
    spec = JobSpec(
        name=name,
        config_toml=config_toml,
        overrides=tuple(args.overrides),
        usd_per_hour=target.stack.outputs.hourly_cost_usd,
        has_code=archive is not None,
        submitted_at=datetime.datetime.now(datetime.UTC),
        command=command,
    )
    stored = target.store_hf_token(os.environ)  # the job reads it at its start
    return (f"{stored}\n" if stored else "") + target.submit(spec, archive)


def check_job(stack_name: str, config: Path, overrides: Sequence[str] = ()) -> Plan | None:
    """The trainer's start-up checks on `config` against the stack's GPUs, as `preview`
    runs them on gpu:trainConfig (infra.planning.check_plan); the stack's plan. A stack
    without a stack file (this machine) has no plan: the job's settings are checked, and the
    trainer checks the rest against the machine at its start."""
    if not config.is_file():
        raise ConfigError(f"--config {config}: not a file (give the path of a training TOML)")
    # The error names the job as typed here, not the stack key it is checked through.
    sets = "".join(f" --set {item}" for item in overrides)
    machine = targets.without_pulumi(stack_name)
    if machine is not None:
        ranks = machine.ranks()
        try:
            validate(load_config(config, overrides), world_size=ranks, gpus_per_node=ranks)
        except ConfigError as exc:
            raise ConfigError(
                f"--config {config}{sets}: the trainer would refuse it on {machine.describe()} "
                f"({ranks} rank(s)): {exc}"
            ) from None
        return None
    path = stack_file_path(stack_name)
    stack_config = load_stack_file(path)
    plan = resolve_plan(stack_config, stack_region(stack_file_region(path)))
    job = stack_config.model_copy(update={"train_config": config.resolve()})
    check_plan(job, plan, overrides, named=f"--config {config}{sets}")
    return plan


def code_archive(folder: Path) -> bytes:
    """The folder as a gzipped tar, its files at the archive's top, caches left out."""
    if not folder.is_dir():
        raise ConfigError(f"--code {folder}: not a folder (give the folder holding your package)")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for path in code_files(folder):
            archive.add(path, arcname=str(path.relative_to(folder)), recursive=False)
    size = buffer.tell()
    if size > MAX_CODE_BYTES:
        raise ConfigError(
            f"--code {folder}: {size / 2**20:.0f} MiB compressed, over "
            f"{MAX_CODE_BYTES // 2**20} MiB: ship code only; put data in S3 (gpu:dataS3Uri)"
        )
    return buffer.getvalue()
