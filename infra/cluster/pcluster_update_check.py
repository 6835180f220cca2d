"""ParallelCluster's own update check between two cluster configs (JSON on stdin, JSON out).

Runs under the interpreter of .venv-pcluster (requirements-pcluster.txt: aws-parallelcluster,
the release the stack deploys), not the project's; infra/cluster/update.py starts it:
`python pcluster_update_check.py < {"cluster_name", "base", "target"}`.

It is what `pcluster update-cluster` and the cluster's CloudFormation custom resource run
before they change a cluster: `ConfigPatch(cluster, base_config, target_config).check()`
(aws-parallelcluster v3.15.1, cli/src/pcluster/config/config_patch.py; the custom resource
calls pcluster's update_cluster: cloudformation/custom_resource/cluster.yaml). Each change's
update policy (config/update_policy.py) asks the cluster for what it depends on: whether the
compute fleet has running capacity, login nodes, the head node's state. The cluster here
answers as a cluster whose fleet is running, or stopped, with the head node running and no
login nodes (the stack has none). The check runs three times:
- `running`: the target as it is, the fleet running (what an update now meets);
- `running_without_strategy`: the same, the target's QueueUpdateStrategy removed, which is
  ParallelCluster's default COMPUTE_FLEET_STOP (cluster_config.py, QueueUpdateStrategy):
  whether the strategy is what allows the change;
- `stopped`: the target as it is, the fleet stopped.
Prints {"changes": [{"path", "old", "new", "policy"}...], and for each run
{"allowed": bool, "refusals": [{"path", "reason", "action"}...]}}.
"""

import copy
import json
import sys
from types import SimpleNamespace


def _cluster(name: str, running: bool):
    """What ConfigPatch's update policies ask of the cluster (config/update_policy.py)."""
    return SimpleNamespace(
        name=name,
        stack_name=name,
        stack=SimpleNamespace(scheduler="slurm"),
        head_node_instance=SimpleNamespace(state="running"),
        has_running_capacity=lambda: running,
        get_running_capacity=lambda: 1 if running else 0,
        has_running_login_nodes=lambda pool_name=None: False,
    )


def _path(path: list[str], key: str) -> str:
    return ".".join([*path, key])


def _check(name: str, base: dict, target: dict, running: bool) -> dict:
    from pcluster.config.config_patch import ConfigPatch

    patch = ConfigPatch(_cluster(name, running), base, target)
    allowed, rows = patch.check()
    header, *rows = rows
    column = {title: index for index, title in enumerate(header)}
    refusals = [
        {
            "path": _path(row[column["param_path"]], row[column["parameter"]]),
            "reason": str(row[column["reason"]]),
            "action": str(row[column["action_needed"]] or ""),
        }
        for row in rows
        if row[column["check"]] != "SUCCEEDED"
    ]
    return {"allowed": bool(allowed), "refusals": refusals, "patch": patch}


def main() -> None:
    request = json.load(sys.stdin)
    name, base, target = request["cluster_name"], request["base"], request["target"]
    without_strategy = copy.deepcopy(target)
    without_strategy.get("Scheduling", {}).get("SlurmSettings", {}).pop("QueueUpdateStrategy", None)
    running = _check(name, base, target, running=True)
    changes = [
        {
            "path": _path(change.path, change.key),
            "old": change.old_value,
            "new": change.new_value,
            "policy": change.update_policy.name,
        }
        for change in running.pop("patch").changes
    ]
    runs = {
        "running": running,
        "running_without_strategy": _check(name, base, without_strategy, running=True),
        "stopped": _check(name, base, target, running=False),
    }
    for run in runs.values():
        run.pop("patch", None)
    json.dump({"changes": changes, **runs}, sys.stdout, default=str)


if __name__ == "__main__":
    main()
