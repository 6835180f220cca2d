"""`run STACK --config JOB.toml [--code DIR] [--name NAME] [--set k=v ...]`: a job on a
running stack, without replacing a node.

The job is checked first, by the trainer's own start-up checks against the stack's GPUs
(as `preview` checks gpu:trainConfig), so a job the trainer would refuse never reaches a
node. On a single-node stack it goes into the job spool in the stack's bucket
(infra/jobs/spool.py), where the node's watcher finds it within seconds; a running job
checkpoints and yields to it (exit 75), then resumes once it ends (docs/stack.md, "Jobs").
On a Slurm cluster it is submitted with sbatch as the cluster's user, on the head node
through SSM (infra/cluster/jobs.py). A name already used resumes that job from its
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

from infra.cluster import jobs as slurm
from infra.commands import head_node, workspace
from infra.commands.job_target import JobTarget, job_target
from infra.config.schema import stack_region
from infra.config.stack_file import load_stack_file, stack_file_path, stack_file_region
from infra.errors import ConfigError
from infra.jobs import hf_token, spool
from infra.jobs.code_check import check_code, code_files
from infra.jobs.spool import JobSpec, JobState
from infra.knowledge.resolver import Plan
from infra.planning import check_plan, resolve_plan
from training.spec.config import add_overrides_argument, load_config

# A spool object, not user data, carries the code; still, a folder this large is a data
# set or a virtual environment by mistake.
MAX_CODE_BYTES = 50 * 1024 * 1024


def add_arguments(parser: argparse.ArgumentParser) -> None:
    workspace.add_stack_argument(parser)
    parser.add_argument("--config", required=True, type=Path, help="the job's training TOML")
    parser.add_argument(
        "--code",
        type=Path,
        metavar="DIR",
        help="a folder shipped with the job and importable in the container "
        "(package.module:function builders; its requirements.txt is installed at start)",
    )
    parser.add_argument("--name", help="the job's name (default: the config file's name)")
    add_overrides_argument(
        parser, help="a training setting over the config's, as `python -m training --set` takes it"
    )


def run(args: argparse.Namespace) -> str:
    """Start a job on a running stack: the node picks it up, no new node (--code DIR)."""
    name = spool.check_name(args.name or args.config.stem)
    stack_name = workspace.stack_name(args)
    plan = check_job(stack_name, args.config, args.overrides)
    archive = None
    if args.code is not None:
        if not args.code.is_dir():
            raise ConfigError(
                f"--code {args.code}: not a folder (give the folder holding your package)"
            )
        check_code(args.code, load_config(args.config, args.overrides), plan.variant)
        archive = code_archive(args.code)
    target = job_target(stack_name)
    spec = JobSpec(
        name=name,
        config_toml=args.config.read_text(),
        overrides=tuple(args.overrides),
        usd_per_hour=target.usd_per_hour,
        has_code=archive is not None,
        submitted_at=datetime.datetime.now(datetime.UTC),
    )
    stored = _store_hf_token(target)
    if target.is_cluster:
        return stored + _submit_to_slurm(target, spec, archive)
    return stored + _submit_to_spool(target, spec, archive)


def _store_hf_token(target: JobTarget) -> str:
    """HF_TOKEN from this shell, when set, as the stack's secret: the job reads it at start."""
    secrets = workspace.aws("secretsmanager", target.stack.region)
    line = hf_token.store(secrets, hf_token.secret_name(target.stack.cost_tag[1]), os.environ)
    return f"{line}\n" if line else ""


def check_job(stack_name: str, config: Path, overrides: Sequence[str] = ()) -> Plan:
    """The trainer's start-up checks on `config` against the stack's GPUs, as `preview`
    runs them on gpu:trainConfig (infra.planning.check_plan); the stack's plan."""
    if not config.is_file():
        raise ConfigError(f"--config {config}: not a file (give the path of a training TOML)")
    path = stack_file_path(stack_name)
    stack_config = load_stack_file(path)
    plan = resolve_plan(stack_config, stack_region(stack_file_region(path)))
    job = stack_config.model_copy(update={"train_config": config.resolve()})
    # The error names the job as typed here, not the stack key it is checked through.
    sets = "".join(f" --set {item}" for item in overrides)
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


def _submit_to_spool(target: JobTarget, spec: JobSpec, archive: bytes | None) -> str:
    s3 = workspace.aws("s3", target.stack.region)
    found = spool.find_job(s3, target.bucket, spec.name)
    if found is not None and found.state in (JobState.QUEUED, JobState.RUNNING):
        raise ConfigError(
            f"--name {spec.name}: that job is {found.state} on {target.stack.name}; cancel it "
            f"first (`python -m infra cancel {target.stack.name} {spec.name}`) or pick another"
        )
    spool.submit(s3, target.bucket, spec, archive)
    resumed = (
        f"job {spec.name} was {found.state}: it resumes from its last checkpoint"
        if found is not None
        else f"job {spec.name} queued"
    )
    return (
        f"{resumed} on {target.stack.name}; the node starts it within "
        f"{spool.POLL_S} s (a running job checkpoints and resumes after it).\n"
        f"follow it: python -m infra jobs {target.stack.name}; "
        f"python -m infra logs {target.stack.name} --job {spec.name}"
    )


def _submit_to_slurm(target: JobTarget, spec: JobSpec, archive: bytes | None) -> str:
    s3 = workspace.aws("s3", target.stack.region)
    in_queue = [job for job in head_node.queue(target.stack) if job.name == spec.name]
    if in_queue:
        raise ConfigError(
            f"--name {spec.name}: that job is in {target.stack.name}'s queue (job "
            f"{in_queue[0].id}, {in_queue[0].state.lower()}); cancel it first or pick another"
        )
    # The code travels through the spool on a cluster too: the container fetches it.
    spool.submit(s3, target.bucket, spec, archive)
    code_uri = f"s3://{target.bucket}/{spool.job_key(spec.name, spool.CODE_NAME)}"
    job_id = head_node.on_head_node(
        target.stack,
        slurm.submit_script(
            slurm.cluster_site(target.bucket), spec, code_uri if spec.has_code else None
        ),
        what=f"submit job {spec.name}",
        timeout_s=slurm.SUBMIT_TIMEOUT_S,
    ).strip()
    return (
        f"job {spec.name} submitted to {target.stack.name}'s Slurm queue as job {job_id} "
        f"(a name run before resumes from its checkpoints).\n"
        f"follow it: python -m infra jobs {target.stack.name}; "
        f"python -m infra logs {target.stack.name} --job {job_id}"
    )
