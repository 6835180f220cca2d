"""The head-node scripts that submit and cancel a job on a Slurm cluster stack.

Both run as root through SSM (infra/commands/head_node.py: on_head_node), in POSIX sh
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

from infra.cluster.config import DEFAULT_USER, QUEUE
from infra.cluster.control import STOP_WAIT_S
from infra.jobs.spool import CODE_NAME, JobSpec, job_key
from infra.jobs.target import JobTarget
from training.code import CODE_URI_ENV

SUBMIT_TIMEOUT_S = 120
# The job's config on the cluster: in the default user's home, which every node mounts.
JOBS_DIR = f"/home/{DEFAULT_USER}/jobs"


def config_path(name: str) -> str:
    return f"{JOBS_DIR}/{name}.toml"


def submit_script(target: JobTarget, spec: JobSpec) -> str:
    """Submit `spec` as the cluster's user; prints the Slurm job id."""
    # Here, not at the top: the component imports Pulumi, which the offline commands
    # that share this command line never load (tests/infra/test_cli.py).
    from infra.components.cluster import JOB_SCRIPT_KEY, JOB_SCRIPT_ON_HEAD_NODE

    config = config_path(spec.name)
    export = "ALL"
    if spec.has_code:
        export += f",{CODE_URI_ENV}=s3://{target.bucket}/{job_key(spec.name, CODE_NAME)}"
    sbatch = [
        "sbatch",
        "--parsable",
        f"--job-name={spec.name}",
        f"--chdir={JOBS_DIR}",
        f"--export={export}",
        JOB_SCRIPT_ON_HEAD_NODE,
        "--config",
        config,
        *(part for override in spec.overrides for part in ("--set", override)),
    ]
    # The config travels base64-encoded: no quote or newline in it can end the script.
    encoded = base64.b64encode(spec.config_toml.encode()).decode()
    return f"""set -eu
aws s3 cp --only-show-errors s3://{target.bucket}/{JOB_SCRIPT_KEY} {JOB_SCRIPT_ON_HEAD_NODE}
install -d -o {DEFAULT_USER} -g {DEFAULT_USER} {JOBS_DIR}
echo {encoded} | base64 -d > {config}
chown {DEFAULT_USER}: {config}
sudo -iu {DEFAULT_USER} {shlex.join(sbatch)}
"""


def cancel_script(name: str, wait_s: int = STOP_WAIT_S) -> str:
    """End every job of the queue named `name` with a checkpoint; prints their ids. Fails when
    none is queued, or when one is still ending after `wait_s`."""
    ids = f"squeue --noheader --partition={QUEUE} --name={shlex.quote(name)} --format=%i"
    return f"""PATH="/opt/slurm/bin:$PATH"
set -u
jobs=$({ids})
if [ -z "$jobs" ]; then
  echo "no job named {name} in the queue" >&2
  exit 3
fi
scancel --full --partition={QUEUE} --name={shlex.quote(name)}
deadline=$(($(date +%s) + {wait_s}))
while [ -n "$({ids})" ]; do
  if [ "$(date +%s)" -ge "$deadline" ]; then
    echo "job {name} still ending after {wait_s} s" >&2
    exit 1
  fi
  sleep 2
done
echo $jobs
"""
