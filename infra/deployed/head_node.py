"""What the commands do to a Slurm cluster stack (gpu:cluster: slurm): find its instances, and
run the head-node scripts of infra/cluster/control.py there through SSM.

AWS facts this relies on:
- ParallelCluster tags each instance it launches with `parallelcluster:node-type`,
  `HeadNode` or `Compute`, and with the cluster's Tags, the stack's `gpu-stack` among them
  (aws-parallelcluster, cli/src/pcluster/templates/cdk_builder_utils.py,
  get_default_instance_tags; Tags in the cluster configuration reference).
- Compute nodes come and go: Slurm starts them for a job and ParallelCluster ends them
  after ScaledownIdletime; only the head node stays (docs.aws.amazon.com/parallelcluster/
  latest/ug/Scheduling-v3.html). So they are found by tag, never from the outputs.
- SendCommand refuses an instance the SSM agent has not registered yet with
  InvalidInstanceId, as a head node just started is for a minute or two (SSM API
  reference, SendCommand; the head node has AmazonSSMManagedInstanceCore).
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from common.market import Market
from infra.cluster.control import STOP_WAIT_S, QueuedJob, parse_queue, queue_script, stop_script
from infra.deployed import nodes, workspace
from infra.deployed.checkpoints import stop_report
from infra.errors import ConfigError

NODE_TYPE_TAG = "parallelcluster:node-type"
ROLES = {"HeadNode": "head", "Compute": "compute"}
# Instance states of a node that exists (a terminated one is kept in listings an hour).
LIVE_STATES = ["pending", "running", "stopping", "stopped", "shutting-down"]
QUEUE_TIMEOUT_S = 60
# How long `start` waits for a head node it just started to answer SSM.
REGISTRATION_WAIT_S = 300


@dataclass(frozen=True)
class ClusterNode:
    role: str  # head, compute
    instance_id: str
    instance_type: str
    state: str
    market: Market


def cluster_nodes(ec2: Any, tag: tuple[str, str], market: Market) -> list[ClusterNode]:
    """The stack's live instances: the head node first, then compute nodes by launch time.

    A compute node runs in the stack's `market` (the queue's CapacityType); the head node is
    on-demand (HeadNode has no capacity type: docs.aws.amazon.com/parallelcluster/latest/ug/
    HeadNode-v3.html).
    """
    key, value = tag
    pages = ec2.get_paginator("describe_instances").paginate(
        Filters=[
            {"Name": f"tag:{key}", "Values": [value]},
            {"Name": "instance-state-name", "Values": LIVE_STATES},
        ]
    )
    found = []
    for page in pages:
        for reservation in page["Reservations"]:
            for instance in reservation["Instances"]:
                tags = {t["Key"]: t["Value"] for t in instance.get("Tags", [])}
                role = ROLES.get(tags.get(NODE_TYPE_TAG, ""), "other")
                node = ClusterNode(
                    role,
                    instance["InstanceId"],
                    instance["InstanceType"],
                    instance["State"]["Name"],
                    Market.ON_DEMAND if role == "head" else market,
                )
                found.append((role != "head", instance["LaunchTime"], node))
    return [node for *_, node in sorted(found, key=lambda item: item[:2])]


def head_node_state(stack: workspace.Deployed, found: list[ClusterNode] | None = None) -> str:
    """The head node's EC2 state, among `found` (default: the stack's nodes now); or gone."""
    if found is None:
        found = cluster_nodes(
            workspace.aws("ec2", stack.region), stack.cost_tag, stack.outputs.market
        )
    for node in found:
        if node.instance_id == stack.outputs.head_node:
            return node.state
    return "gone"


def on_head_node(
    stack: workspace.Deployed,
    script: str,
    *,
    what: str,
    timeout_s: float,
    sleep: Callable[[float], None] = time.sleep,
    registration_wait_s: float = 0,
) -> str:
    """Run `script` on the head node and return what it printed; ConfigError if it failed."""
    ssm = workspace.aws("ssm", stack.region)
    waited = 0.0
    while True:
        try:
            ended = nodes.run_script(
                ssm,
                [stack.outputs.head_node],
                script,
                comment=f"gpu-training-stack: {what}",
                timeout_s=timeout_s,
                sleep=sleep,
            )
            break
        except ssm.exceptions.InvalidInstanceId:
            if waited >= registration_wait_s:
                after = f" after {waited:g} s" if waited else ""
                raise ConfigError(
                    f"the head node {stack.outputs.head_node} of {stack.name} does not answer SSM "
                    f"(its agent is not registered{after}): if it just started, try again in "
                    "a minute; else see why with `aws ec2 get-console-output --instance-id "
                    f"{stack.outputs.head_node}`"
                ) from None
            sleep(nodes.POLL_S)
            waited += nodes.POLL_S
    invocation = ended[stack.outputs.head_node]
    if invocation.status != "Success":
        raise ConfigError(
            f"{what} on the head node {stack.outputs.head_node} ended {invocation.status}: "
            f"{(invocation.stderr or invocation.stdout).strip()[-500:] or 'no output'}"
        )
    return invocation.stdout


def queue(stack: workspace.Deployed, *, sleep: Callable[[float], None] = time.sleep):
    """The jobs of the cluster's queue, as squeue lists them on the head node."""
    return parse_queue(
        on_head_node(
            stack, queue_script(), what="read the queue", timeout_s=QUEUE_TIMEOUT_S, sleep=sleep
        )
    )


def run_uri(stack: workspace.Deployed, job: QueuedJob) -> str | None:
    """Where a job's checkpoints and status.json go: a prefix per job name (train.sbatch)."""
    root = stack.checkpoint_uri
    return f"{root.rstrip('/')}/{job.name}" if root else None


def hold_queue(
    stack: workspace.Deployed, *, say: Callable[[str], None], sleep: Callable[[float], None]
) -> list[QueuedJob]:
    """Checkpoint and hold every job of the cluster's queue; the held jobs."""
    asked = datetime.datetime.now(datetime.UTC)
    say("holding the queue: running jobs checkpoint first (up to 2 min)")
    jobs = parse_queue(
        on_head_node(
            stack,
            stop_script(),
            what="checkpoint and hold the queue",
            timeout_s=STOP_WAIT_S + 60,
            sleep=sleep,
        )
    )
    s3 = workspace.aws("s3", stack.region)
    for job in jobs:
        say(f"job {job.id} ({job.name}): {stop_report(s3, run_uri(stack, job), asked)}")
    return [job for job in jobs if job.held]
