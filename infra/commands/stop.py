"""`stop [STACK]`: checkpoint the job and stop the nodes; the disks, addresses and bill for
storage stay, the GPU bill stops. `start` brings them back and the job resumes.

On a Slurm cluster stack the queue is held instead (infra/cluster/control.py): running jobs
checkpoint and go back to the queue, held, and ParallelCluster ends the idle compute nodes
after ScaledownIdletime. The head node keeps running: it holds the queue.
"""

from __future__ import annotations

import argparse
import datetime
import sys
import time
from collections.abc import Callable

from infra.cluster.config import SCALEDOWN_IDLE_MINUTES
from infra.commands import head_node, nodes, workspace
from infra.commands.checkpoints import last_checkpoint, stop_report
from infra.jobs.spool import current_run_uri


def add_arguments(parser: argparse.ArgumentParser) -> None:
    workspace.add_stack_argument(parser)


def run(args: argparse.Namespace, *, out=None, sleep: Callable[[float], None] = time.sleep) -> str:
    """Checkpoint the job, then stop every node or hold the Slurm queue (start resumes)."""
    say = workspace.printer(out or sys.stdout)
    stack = workspace.deployed(workspace.stack_name(args))
    if stack.is_cluster:
        return stop_cluster(stack, say=say, sleep=sleep)
    ec2 = workspace.aws("ec2", stack.region)
    running = [n.instance_id for n in nodes.nodes(ec2, stack.instance_ids) if n.state == "running"]
    if not running:
        return f"no node of {stack.name} is running: nothing to stop"
    asked = datetime.datetime.now(datetime.UTC)
    results = nodes.stop_job(workspace.aws("ssm", stack.region), running, say=say, sleep=sleep)
    failed = sorted(i for i, status in results.items() if status != "Success")
    if failed:
        say(
            f"the job did not confirm its stop on {', '.join(failed)} (SSM: "
            f"{', '.join(results[i] for i in failed)}): stopping anyway; the job resumes from "
            "its last committed checkpoint"
        )
    s3 = workspace.aws("s3", stack.region)
    run_uri = current_run_uri(s3, stack.checkpoint_uri)  # the spool's current job
    say(stop_report(s3, run_uri, asked))
    # A user stop of a persistent spot instance disables its request until start (EC2 docs).
    ec2.stop_instances(InstanceIds=running)
    ec2.get_waiter("instance_stopped").wait(
        InstanceIds=running, WaiterConfig={"Delay": 5, "MaxAttempts": 120}
    )
    checkpoint = last_checkpoint(s3, run_uri)
    return (
        f"stopped {len(running)} node(s) of {stack.name}; last checkpoint "
        f"{checkpoint.describe() if checkpoint else 'none in S3'}. "
        f"`python -m infra start {stack.name}` resumes the job."
    )


def stop_cluster(stack: workspace.Deployed, *, say, sleep) -> str:
    state = head_node.head_node_state(stack)
    if state != "running":
        return f"the head node of {stack.name} is {state}: no job runs, nothing to stop"
    held = head_node.hold_queue(stack, say=say, sleep=sleep)
    idle = stack.outputs.idle_usd_per_hour or 0
    return (
        f"held {len(held)} job(s) of {stack.name}; the compute nodes end after "
        f"{SCALEDOWN_IDLE_MINUTES} idle minutes, and the head node keeps the queue "
        f"(${idle:,.3f}/h). `python -m infra start {stack.name}` releases the jobs, "
        f"`python -m infra down {stack.name}` removes the cluster."
    )
