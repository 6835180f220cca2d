"""What a change to a deployed Slurm cluster needs, in ParallelCluster's own words.

`pulumi up` changes a cluster by updating the CloudFormation stack that holds its custom
resource, whose Lambda runs ParallelCluster's update_cluster: it refuses a change its update
policy forbids in the cluster's present state, and the stack rolls back
(aws-parallelcluster, cloudformation/custom_resource/cluster.yaml). The custom resource never
stops the compute fleet itself ("The custom resource provider doesn't stop the compute fleet
before updating": https://docs.aws.amazon.com/parallelcluster/latest/ug/cfn-cluster-ops.html).
Removing a compute resource (one is named after its instance type: config.py,
compute_resource_name) or lowering MaxCount needs the fleet stopped or QueueUpdateStrategy
TERMINATE (config/update_policy.py, RESIZE_UPDATE_STRATEGY_ON_REMOVE); the stack's DRAIN
covers a change of capacity type or custom actions, not those.

So before anything changes, `preview` and `up` ask ParallelCluster's own check (its
ConfigPatch, in .venv-pcluster: pcluster_update_check.py) about the deployed cluster config
and the one Pulumi will send, and say what the update needs:
- nothing (no change to the cluster), or its creation;
- in place, the jobs running on;
- a drain: allowed only through QueueUpdateStrategy DRAIN; nodes finish their job first;
- a fleet stop: allowed only with the compute fleet stopped, which `up` does itself, the
  ParallelCluster way (infra/deployed/cluster_update.py);
- a replacement: refused even then.
The check is the pinned release's (requirements-pcluster.txt); a stack deployed with another
`gpu:parallelClusterVersion` is checked by that release's rules, which may differ.
"""

from __future__ import annotations

import enum
import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infra.errors import ConfigError
from infra.project import find_project_root

CHECK_SCRIPT = Path(__file__).with_name("pcluster_update_check.py")
# The interpreter that has aws-parallelcluster (scripts/bootstrap makes .venv-pcluster).
PCLUSTER_PYTHON_ENV = "PCLUSTER_PYTHON"
CHECK_TIMEOUT_S = 120


class UpdateNeed(enum.Enum):
    NONE = "nothing"
    CREATE = "a new cluster"
    IN_PLACE = "an update in place"
    DRAIN = "a drain"
    FLEET_STOP = "a fleet stop"
    REPLACEMENT = "a replacement"


@dataclass(frozen=True)
class ClusterChange:
    path: (
        str  # ParallelCluster's path of the setting, e.g. Scheduling.SlurmQueues[gpu].CapacityType
    )
    old: Any
    new: Any
    policy: str  # its update policy (config/update_policy.py)

    def describe(self) -> str:
        return f"{self.path} {_value(self.old)} -> {_value(self.new)}"


@dataclass(frozen=True)
class UpdateVerdict:
    need: UpdateNeed
    changes: tuple[ClusterChange, ...] = ()
    # ParallelCluster's reasons, for a fleet stop (with the fleet running) or a replacement.
    reasons: tuple[str, ...] = ()

    def line(self) -> str:
        """What the update needs, in one line."""
        changed = "; ".join(change.describe() for change in self.changes)
        why = "; ".join(dict.fromkeys(self.reasons))
        if self.need is UpdateNeed.NONE:
            return "cluster update: nothing: the cluster's configuration does not change"
        if self.need is UpdateNeed.CREATE:
            return "cluster update: a new cluster: this up creates it"
        if self.need is UpdateNeed.IN_PLACE:
            return f"cluster update: in place, running jobs go on ({changed})"
        if self.need is UpdateNeed.DRAIN:
            return (
                "cluster update: a drain: running jobs finish, then their nodes are replaced "
                f"({changed})"
            )
        if self.need is UpdateNeed.FLEET_STOP:
            return (
                "cluster update: a fleet stop: up checkpoints and holds the jobs, stops the "
                "compute fleet, updates the cluster, starts the fleet and releases the jobs "
                f"({changed}; ParallelCluster: {why})"
            )
        return (
            f"cluster update: a replacement: ParallelCluster refuses {changed} even with the "
            f"compute fleet stopped ({why}); nothing was changed: `down` the stack, then `up`"
        )


def cluster_configuration(template_body: str) -> dict:
    """The cluster config inside the stack's CloudFormation template
    (infra/components/cluster.py, cloudformation_template)."""
    template = json.loads(template_body)
    return template["Resources"]["PclusterCluster"]["Properties"]["ClusterConfiguration"]


def pcluster_python() -> str:
    """The interpreter of .venv-pcluster, or PCLUSTER_PYTHON; ConfigError when neither is."""
    python = os.environ.get(PCLUSTER_PYTHON_ENV) or str(
        find_project_root() / ".venv-pcluster" / "bin" / "python"
    )
    if not Path(python).is_file():
        raise ConfigError(
            f"ParallelCluster's update check needs aws-parallelcluster, which is not "
            f"installed at {python}: run scripts/bootstrap (it makes .venv-pcluster), or set "
            f"{PCLUSTER_PYTHON_ENV}; nothing was changed"
        )
    return python


def check_update(
    cluster_name: str, base: dict | None, target: dict, python: str | None = None
) -> UpdateVerdict:
    """ParallelCluster's verdict on changing the cluster config `base` (None: no cluster
    yet) into `target`."""
    if base is None:
        return UpdateVerdict(UpdateNeed.CREATE)
    result = run_check(cluster_name, base, target, python)
    changes = _merged([ClusterChange(**change) for change in result["changes"]])
    if not changes:
        return UpdateVerdict(UpdateNeed.NONE)
    if result["running"]["allowed"]:
        drain = not result["running_without_strategy"]["allowed"]
        return UpdateVerdict(UpdateNeed.DRAIN if drain else UpdateNeed.IN_PLACE, changes)
    if result["stopped"]["allowed"]:
        reasons = tuple(refusal["reason"] for refusal in result["running"]["refusals"])
        return UpdateVerdict(UpdateNeed.FLEET_STOP, changes, reasons)
    reasons = tuple(refusal["reason"] for refusal in result["stopped"]["refusals"])
    return UpdateVerdict(UpdateNeed.REPLACEMENT, changes, reasons)


def run_check(cluster_name: str, base: dict, target: dict, python: str | None = None) -> dict:
    """pcluster_update_check.py's answer (its docstring says what it holds)."""
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": os.environ.get("HOME", "/tmp"),
        # The check calls no AWS API; ParallelCluster's modules want a region to load.
        "AWS_DEFAULT_REGION": target.get("Region") or "us-east-1",
    }
    request = {"cluster_name": cluster_name, "base": base, "target": target}
    result = subprocess.run(
        [python or pcluster_python(), str(CHECK_SCRIPT)],
        input=json.dumps(request),
        capture_output=True,
        text=True,
        env=env,
        timeout=CHECK_TIMEOUT_S,
    )
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise ConfigError(f"ParallelCluster's update check failed ({last}); nothing was changed")
    return json.loads(result.stdout)


def _merged(changes: list[ClusterChange]) -> tuple[ClusterChange, ...]:
    """A list item ParallelCluster reports removed and another added at the same path (a
    compute resource renamed with its instance type) as one change."""
    merged: list[ClusterChange] = []
    for change in changes:
        pair = next(
            (
                index
                for index, earlier in enumerate(merged)
                if earlier.path == change.path
                and earlier.policy == change.policy
                and (earlier.old is None) != (change.old is None)
                and (earlier.new is None) != (change.new is None)
            ),
            None,
        )
        if pair is None:
            merged.append(change)
            continue
        earlier = merged[pair]
        merged[pair] = ClusterChange(
            change.path,
            earlier.old if earlier.old is not None else change.old,
            earlier.new if earlier.new is not None else change.new,
            change.policy,
        )
    return tuple(merged)


def _value(value: Any) -> str:
    """A setting's value, short: a list item by its name."""
    if value is None:
        return "-"
    if isinstance(value, dict):
        return str(value.get("Name") or value.get("InstanceType") or json.dumps(value))
    return str(value)
