"""The one seam between the commands and a running stack: a `Target` per kind of stack.

Every command that acts on a stack that is up (run, jobs, cancel, logs, status, stop, start,
down) opens its target once, with `open_target`, and asks it; no command asks which kind it
talks to. The protocol is infra/targets/target.py; what differs between the kinds lives in
one file per kind:

- infra/targets/ec2_spool.py: the single-node stack (gpu:cluster unset). Jobs go through the
  job spool in the stack's bucket (infra/jobs/spool.py), which the node's watcher reads;
  the node is stopped and started through EC2, the job reached through SSM.
- infra/targets/slurm.py: the ParallelCluster stack (gpu:cluster: slurm). Jobs are sbatch
  jobs submitted on the head node through SSM; `stop` holds the queue.
- infra/targets/local.py: the local stack (stack name `local`): this machine, outside
  Pulumi and AWS. Its jobs run here, each under a runner of its own; `down` stops them and
  there is nothing to destroy (`without_pulumi`).

Each kind's file also holds its `Deployment`: what `preview` and `up` do around Pulumi for
that kind (a Slurm cluster's update may need its compute fleet stopped). A new kind of stack
(Kubernetes, a machine at hand) is one new file here that implements both, and a line in
`_kinds` and `_deployments`. tests/infra/commands/fake_target.py is such a file: the
commands' tests run against it as against the two real kinds.
"""

from __future__ import annotations

from collections.abc import Callable

from infra.config.schema import StackConfig
from infra.deployed import workspace
from infra.knowledge.resolver import Plan
from infra.outputs import CLUSTER, LOCAL, SINGLE_NODE
from infra.targets.target import (
    FOLLOW_POLL_S,
    Deployment,
    JobList,
    ListedJob,
    MachineTarget,
    Say,
    Sleep,
    Target,
)

__all__ = [
    "FOLLOW_POLL_S",
    "Deployment",
    "JobList",
    "ListedJob",
    "MachineTarget",
    "Say",
    "Sleep",
    "Target",
    "deployment",
    "open_target",
    "without_pulumi",
]


def _kinds() -> dict[str, Callable[[workspace.Deployed], Target]]:
    from infra.targets.ec2_spool import SpoolTarget
    from infra.targets.local import LocalTarget
    from infra.targets.slurm import SlurmTarget

    return {SINGLE_NODE: SpoolTarget, CLUSTER: SlurmTarget, LOCAL: LocalTarget}


def _deployments() -> dict[str, Callable[[str, Plan], Deployment]]:
    from infra.targets.ec2_spool import SpoolDeployment
    from infra.targets.slurm import SlurmDeployment

    return {SINGLE_NODE: SpoolDeployment, CLUSTER: SlurmDeployment}


def deployment(name: str, config: StackConfig, plan: Plan) -> Deployment:
    """How `preview` and `up` change stack `name`, of the kind its stack file asks for
    (gpu:cluster; unset: the single-node stack), resolved to `plan`."""
    return _deployments()[config.cluster or SINGLE_NODE](name, plan)


def open_target(stack: workspace.Deployed) -> Target:
    """The target of a stack that is up, chosen by the kind its outputs name."""
    return _kinds()[stack.outputs.kind](stack)


def without_pulumi(name: str) -> MachineTarget | None:
    """The target of stack `name` when no Pulumi program makes it (the local stack: this
    machine, always up), else None."""
    if name != LOCAL:
        return None
    from infra.targets import local

    return local.LocalTarget(local.deployed())


def target(name: str) -> Target:
    """The target of stack `name`; ConfigError when it is not up."""
    return without_pulumi(name) or open_target(workspace.deployed(name))
