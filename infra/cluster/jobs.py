"""The head-node scripts that submit and cancel a job on a Slurm cluster stack.

Both run as root through SSM (infra/deployed/head_node.py: on_head_node), in POSIX sh
(infra/cluster/control.py says why), and act as the cluster's default user, who exists
on every node, in a login shell (`sudo -iu`): only the login profile puts /opt/slurm/bin
on PATH. The submission is the one the stack prints (`pulumi stack output
submit_command`, infra/components/cluster.py): refresh the job script from the bucket,
then sbatch it, here with the job's name (its checkpoint prefix, so the same name
resumes), its config file in the user's shared home and the spool's code archive.

Slurm facts (https://slurm.schedmd.com/sbatch.html, scancel.html):
- `sbatch --parsable` prints the job id alone; `--export=ALL,NAME=value` passes the
  submitting environment plus NAME to the job.
- `scancel --full` signals the batch shell and every step with SIGTERM, then SIGKILL after
  KillWait (slurm.conf(5)): the trainer checkpoints on that SIGTERM. A cancelled job leaves
  the queue for good: it is not requeued.
"""

from __future__ import annotations

import base64
import shlex
from dataclasses import dataclass

from infra.cluster.config import DEFAULT_USER, JOB_SCRIPT_KEY, JOB_SCRIPT_ON_HEAD_NODE, QUEUE
from infra.cluster.control import STOP_WAIT_S
from infra.functions.slurm_queue import SLURM_PATH, wait_until_gone
from infra.jobs.spool import JobSpec
from training.contract import CODE_URI_ENV

SUBMIT_TIMEOUT_S = 120


@dataclass(frozen=True)
class SubmitSite:
    """Where the head node keeps the job script and the jobs' configs, and who submits."""

    job_script: str  # the batch script (infra/cluster/templates/train.sbatch, rendered)
    jobs_dir: str  # each job's config, in a folder every node mounts
    job_script_uri: str | None = None  # refreshed from here first; None: used as it is
    user: str | None = None  # sbatch as this user, in a login shell; None: as the caller


def cluster_site(bucket: str) -> SubmitSite:
    """The stack's head node: the job script from the bucket, submitted as the default user
    from a folder in their home, which every node mounts."""
    return SubmitSite(
        job_script=JOB_SCRIPT_ON_HEAD_NODE,
        jobs_dir=f"/home/{DEFAULT_USER}/jobs",
        job_script_uri=f"s3://{bucket}/{JOB_SCRIPT_KEY}",
        user=DEFAULT_USER,
    )


def submit_script(site: SubmitSite, spec: JobSpec, code_uri: str | None) -> str:
    """Submit `spec` on the head node; prints the Slurm job id."""
    config = f"{site.jobs_dir}/{spec.name}.toml"
    export = f"ALL,{CODE_URI_ENV}={code_uri}" if code_uri else "ALL"
    sbatch = [
        "sbatch",
        "--parsable",
        f"--job-name={spec.name}",
        f"--chdir={site.jobs_dir}",
        f"--export={export}",
        site.job_script,
        *([] if spec.command else ["--config", config]),
        *spec.trainer_arguments(),
    ]
    lines = ["set -eu"]
    if site.job_script_uri:
        lines.append(f"aws s3 cp --only-show-errors {site.job_script_uri} {site.job_script}")
    # The config travels base64-encoded: no quote or newline in it can end the script.
    encoded = base64.b64encode(spec.config_toml.encode()).decode()
    lines += [f"mkdir -p {site.jobs_dir}", f"echo {encoded} | base64 -d > {config}"]
    if site.user:
        lines += [
            f"chown {site.user}: {site.jobs_dir} {config}",
            f"sudo -iu {site.user} {shlex.join(sbatch)}",
        ]
    else:
        lines.append(f'PATH="/opt/slurm/bin:$PATH" {shlex.join(sbatch)}')
    return "\n".join(lines) + "\n"


def cancel_script(name: str, wait_s: int = STOP_WAIT_S) -> str:
    """End every job of the queue named `name` with a checkpoint; prints their ids. Fails when
    none is queued, or when one is still ending after `wait_s`."""
    ids = f"squeue --noheader --partition={QUEUE} --name={shlex.quote(name)} --format=%i"
    return f"""{SLURM_PATH}set -u
jobs=$({ids})
if [ -z "$jobs" ]; then
  echo "no job named {name} in the queue" >&2
  exit 3
fi
scancel --full --partition={QUEUE} --name={shlex.quote(name)}
{wait_until_gone(ids, f"job {name}", wait_s)}echo $jobs
"""
