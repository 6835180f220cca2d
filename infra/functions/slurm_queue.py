"""Holding a Slurm cluster's queue from its head node: the script `stop`, `down`, `up` (before a
fleet stop) and the spend guard (before it ends the compute nodes at the budget) all run there
through SSM. Standard library only: the guard's Lambda archive carries this module.

Slurm facts it relies on (https://slurm.schedmd.com/scontrol.html, squeue.html):
- `scontrol requeuehold JOB` ends a running batch job the way Slurm ends any job (SIGTERM,
  KillWait seconds, SIGKILL: slurm.conf(5), KillWait) and puts it back in the queue,
  pending and held; the trainer checkpoints on that SIGTERM. `scontrol hold` keeps a
  pending job from starting, `scontrol release` lets both start again.
- A held job is a pending job of priority 0: that is what `scontrol hold` sets.

Where it runs: SSM's AWS-RunShellScript writes the commands into a script that `sh` runs
(aws/amazon-ssm-agent, agent/plugins/runscript: ShellCommand "sh", "-c"), dash on Ubuntu,
reading no login profile; ParallelCluster keeps Slurm in /opt/slurm (a directory its
validators reserve, pcluster/validators/cluster_validators.py), which only the login profile
puts on PATH. So the script is POSIX sh and puts /opt/slurm/bin on PATH itself.
"""

from __future__ import annotations

import shlex

# Seconds between the SIGTERM and the SIGKILL when Slurm ends a job (slurm.conf(5),
# KillWait; default 30): the time a stopped job has to checkpoint, as long as the single-node
# unit gives it (docker stop --time 100) and a little more. The cluster's slurm.conf gets it
# (infra/cluster/config.py, CustomSlurmSettings).
KILL_WAIT_S = 120
# How long holding the queue waits for the running jobs to end: KillWait plus the time Slurm
# takes to put them back in the queue.
JOB_END_WAIT_S = KILL_WAIT_S + 60
# How long one who asks for the hold through SSM waits for it (the spend guard, before its
# budget stop): the hold's own wait and the time SSM takes to deliver the command and report.
HOLD_BOUND_S = JOB_END_WAIT_S + 30
SLURM_PATH = 'PATH="/opt/slurm/bin:$PATH"\n'
# squeue --format fields, in order: id, name, state (long form), nodes, elapsed, priority
# (an integer), reason.
QUEUE_FORMAT = "%i|%j|%T|%D|%M|%Q|%r"


def squeue(partition: str) -> str:
    return f"squeue --noheader --partition={partition} --format={shlex.quote(QUEUE_FORMAT)}"


def wait_until_gone(query: str, what: str, wait_s: int) -> str:
    """POSIX sh: poll `query` every 2 s until it prints nothing; exit 1 naming `what` once
    `wait_s` has passed."""
    return f"""deadline=$(($(date +%s) + {wait_s}))
while [ -n "$({query})" ]; do
  if [ "$(date +%s)" -ge "$deadline" ]; then
    echo "{what} still ending after {wait_s} s" >&2
    exit 1
  fi
  sleep 2
done
"""


def hold_script(partition: str, wait_s: int = JOB_END_WAIT_S) -> str:
    """Hold every job of the queue; running ones checkpoint and end first (requeuehold).
    Prints the queue after, one job a line in QUEUE_FORMAT."""
    list_jobs = f"squeue --noheader --partition={partition} --format=%i"
    ending = f"{list_jobs} --states=RUNNING,CONFIGURING,COMPLETING,SUSPENDED"
    return f"""{SLURM_PATH}set -u
for job in $({list_jobs} --states=PENDING); do scontrol hold "$job"; done
for job in $({list_jobs} --states=RUNNING,CONFIGURING,SUSPENDED); do
  scontrol requeuehold "$job"
done
{wait_until_gone(ending, "jobs", wait_s)}{squeue(partition)}
"""
