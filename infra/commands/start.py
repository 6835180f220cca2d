"""`start [STACK]`: start stopped nodes again; the boot unit resumes the job from its last
committed checkpoint (local disk, or S3 when newer).

On a Slurm cluster stack: start the head node if it is stopped (the spend guard stops it
at the budget), start the compute fleet again if the guard stopped it, then release the held
jobs; Slurm starts compute nodes for them and each resumes from its checkpoint.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

from infra.cluster.control import parse_queue, release_script
from infra.commands import head_node, nodes, workspace
from infra.commands.checkpoints import last_checkpoint
from infra.commands.cluster_fleet import start_fleet
from infra.errors import ConfigError
from infra.jobs.spool import current_run_uri


def add_arguments(parser: argparse.ArgumentParser) -> None:
    workspace.add_stack_argument(parser)


def run(args: argparse.Namespace, *, out=None, sleep: Callable[[float], None] = time.sleep) -> str:
    """Start the stopped nodes or release the held Slurm queue; jobs resume."""
    stack = workspace.deployed(workspace.stack_name(args))
    if stack.is_cluster:
        return start_cluster(stack, say=workspace.printer(out or sys.stdout), sleep=sleep)
    ec2 = workspace.aws("ec2", stack.region)
    stopped = [n.instance_id for n in nodes.nodes(ec2, stack.instance_ids) if n.state == "stopped"]
    if not stopped:
        return (
            f"no node of {stack.name} is stopped: nothing to start (see `python -m infra status`)"
        )
    ec2.start_instances(InstanceIds=stopped)
    s3 = workspace.aws("s3", stack.region)
    checkpoint = last_checkpoint(s3, current_run_uri(s3, stack.checkpoint_uri))
    return (
        f"starting {len(stopped)} node(s) of {stack.name}; the job resumes from "
        f"{checkpoint.describe() if checkpoint else 'step 0 (no checkpoint in S3 yet)'}. "
        f"Follow it with `python -m infra logs {stack.name} --follow`."
    )


def start_cluster(stack: workspace.Deployed, *, say, sleep) -> str:
    ec2 = workspace.aws("ec2", stack.region)
    state = head_node.head_node_state(stack)
    if state == "gone":
        raise ConfigError(
            f"the head node {stack.head_node} of {stack.name} is gone: "
            f"`python -m infra up {stack.name}` shows what the stack needs"
        )
    if state != "running":
        say(f"starting the head node {stack.head_node} (it was {state})")
        ec2.start_instances(InstanceIds=[stack.head_node])
        ec2.get_waiter("instance_running").wait(
            InstanceIds=[stack.head_node], WaiterConfig={"Delay": 5, "MaxAttempts": 120}
        )
    start_fleet(stack, say=say, sleep=sleep)
    released = parse_queue(
        head_node.on_head_node(
            stack,
            release_script(),
            what="release the held jobs",
            timeout_s=60,
            sleep=sleep,
            registration_wait_s=head_node.REGISTRATION_WAIT_S,
        )
    )
    # Jobs Slurm put back in the queue unheld (a node lost, a budget stop that could not
    # hold them first) start again too: they are listed with the released ones.
    released_ids = {job.id for job in released}
    queued = [job for job in head_node.queue(stack, sleep=sleep) if job.id not in released_ids]
    if not released and not queued:
        return f"the queue of {stack.name} is empty: nothing to resume"
    s3 = workspace.aws("s3", stack.region)
    lines = [f"the queue of {stack.name}: Slurm starts nodes for its pending jobs (minutes)"]
    for job, what in [
        *((job, "released") for job in released),
        *((job, job.state.lower()) for job in queued),
    ]:
        checkpoint = last_checkpoint(s3, head_node.run_uri(stack, job))
        since = checkpoint.describe() if checkpoint else "step 0 (no checkpoint in S3 yet)"
        lines.append(f"  job {job.id} ({job.name}) {what}: resumes from {since}")
    lines.append(f"Follow it with `python -m infra logs {stack.name} --follow`.")
    return "\n".join(lines)
