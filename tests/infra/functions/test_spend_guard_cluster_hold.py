"""A budget stop on a Slurm cluster: the jobs checkpoint and are held before the guard ends
the compute nodes (infra/functions/spend_guard.py, _hold_jobs), as `stop` holds them.

The head node is this host over the loopback Slurm cluster (tests/support/head_node.py, SSM
Run Command played by `sh` here), where a real two-node training job, submitted by a user
who is not root, runs; the stack's instances and its fleet's status are moto's.
"""

from __future__ import annotations

import datetime
import re

import pytest

from infra.cluster.config import QUEUE
from tests.infra.cluster.jobs import Submitted
from tests.infra.functions.world import HEAD_NODE_TYPE, Ec2, World, guard, settings
from tests.support.aws import fleet_table
from tests.support.head_node import HeadNodeSSM
from tests.support.slurm import JOB_USER

MONDAY = datetime.datetime(2026, 12, 7, tzinfo=datetime.UTC)


class Watched(Ec2):
    """moto's EC2, noting the job as it is when the guard terminates the compute nodes."""

    def __init__(self, ec2, world, job: Submitted) -> None:
        super().__init__(ec2, world)
        self.job, self.at_termination = job, []

    def terminate_instances(self, InstanceIds):
        stops = re.findall(r"stopped at step (\d+) \(SIGTERM\); checkpoint saved", self.job.log)
        self.at_termination.append((self.job.state(), stops))
        return self._ec2.terminate_instances(InstanceIds=InstanceIds)


@pytest.mark.slow(reason="a two-node training job checkpoints on the hold's SIGTERM", seconds=110)
def test_a_budget_stop_holds_the_clusters_jobs_with_a_checkpoint_before_ending_its_nodes(
    aws, topic, slurm, ci_log
):
    topic_arn, _ = topic
    world = World(aws["ec2"], MONDAY)
    fleet_table(aws["dynamodb"], "demo")
    config = settings(topic_arn, 1.0, cluster_name="demo", cluster_queue=QUEUE)
    head = world.launch(HEAD_NODE_TYPE, node_type="HeadNode")
    compute = {world.launch(node_type="Compute") for _ in range(2)}
    job = Submitted(slurm)
    try:
        job.wait_for_step(3)
        ec2 = Watched(aws["ec2"], world, job)
        world.advance(minutes=30)  # two p4d.24xlarge for half an hour: past $1
        outcome = guard(aws, world, config, ec2=ec2, ssm=HeadNodeSSM(slurm, head))
        assert outcome.ledger.stopped
        assert set(outcome.terminated_instances) == compute
        assert outcome.stopped_instances == (head,)
        # Held, with both ranks' checkpoint, before the first compute node was ended.
        (state, stops), *_ = ec2.at_termination
        assert state["JobState"] == "PENDING" and state["Priority"] == "0", state
        assert len(stops) == 2 and stops[0] == stops[1], job.log[-3000:]
        assert state["UserId"].startswith(f"{JOB_USER}(")
        assert not [p for p in outcome.problems if "hold" in p or "checkpoint" in p]
        ci_log(
            f"slurm test: budget stop: job {job.id} (submitted by {JOB_USER}) checkpointed at "
            f"step {stops[0]} and held before the guard ended {len(compute)} compute nodes"
        )
    finally:
        slurm.command("scancel", job.id, check=False)


def test_without_the_head_node_a_budget_stop_still_ends_the_nodes_and_says_why(aws, topic):
    topic_arn, _ = topic
    world = World(aws["ec2"], MONDAY)
    fleet_table(aws["dynamodb"], "demo")
    config = settings(topic_arn, 1.0, cluster_name="demo", cluster_queue=QUEUE)
    compute = {world.launch(node_type="Compute") for _ in range(2)}
    world.advance(minutes=30)
    outcome = guard(aws, world, config)
    assert set(outcome.terminated_instances) == compute
    assert outcome.problems == (
        "cluster demo's head node is not running: its jobs end with the compute nodes, "
        "without a checkpoint",
    )
