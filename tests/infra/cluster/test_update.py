"""ParallelCluster's own update check (aws-parallelcluster 3.15.1's ConfigPatch, in
.venv-pcluster) on the cluster configs the real program renders for a deployed stack and
for its changed stack file: what each change needs.

Expected verdicts, from ParallelCluster's update policies (cli/src/pcluster/config/
update_policy.py and schemas/cluster_schema.py): a compute resource is keyed by its name,
which is the instance type's (infra/cluster/config.py), so a new type removes one
(RESIZE_UPDATE_STRATEGY_ON_REMOVE: fleet stopped or TERMINATE); a lower MaxCount likewise,
a higher one is allowed; CapacityType is QUEUE_UPDATE_STRATEGY (allowed by DRAIN).
"""

from __future__ import annotations

import json
import subprocess

import pytest

from infra.cluster.config import check_cluster_name
from infra.cluster.update import (
    UpdateNeed,
    check_update,
    cluster_configuration,
    run_check,
)
from infra.errors import ConfigError
from tests.infra.cluster.test_config import pcluster_python
from tests.support.stack_runs import cluster_template

__all__ = ["pcluster_python"]  # the fixture

CLUSTER = "gpu-training-stack-test"
# The deployed stack: two spot p4d.24xlarge nodes.
DEPLOYED = {"cluster": "slurm", "nodes": 2, "instanceType": "p4d.24xlarge", "spot": True}


def rendered(**changes) -> dict:
    """The cluster config the program sends for the deployed stack file with `changes`."""
    return cluster_configuration(cluster_template(**{**DEPLOYED, **changes}))


@pytest.fixture(scope="module")
def deployed() -> dict:
    return rendered()


@pytest.mark.parametrize(
    ("changes", "need", "described"),
    [
        (
            {"instanceType": "p5.48xlarge"},
            UpdateNeed.FLEET_STOP,
            "Scheduling.SlurmQueues[gpu].ComputeResources p4d-24xlarge -> p5-48xlarge",
        ),
        (
            {"nodes": 1},
            UpdateNeed.FLEET_STOP,
            "Scheduling.SlurmQueues[gpu].ComputeResources[p4d-24xlarge].MaxCount 2 -> 1",
        ),
        (
            {"nodes": 4},
            UpdateNeed.IN_PLACE,
            "Scheduling.SlurmQueues[gpu].ComputeResources[p4d-24xlarge].MaxCount 2 -> 4",
        ),
        (
            {"spot": False},
            UpdateNeed.DRAIN,
            "Scheduling.SlurmQueues[gpu].CapacityType SPOT -> ONDEMAND",
        ),
        ({"imageTag": "0.2.0-cu128"}, UpdateNeed.NONE, None),
    ],
    ids=["p4d-to-p5", "2-to-1-nodes", "2-to-4-nodes", "spot-to-on-demand", "new-image-tag"],
)
def test_parallelclusters_check_says_what_each_change_needs(
    pcluster_python, deployed, changes, need, described
):
    target = rendered(**changes)
    verdict = check_update(CLUSTER, deployed, target, python=pcluster_python)
    assert verdict.need is need, verdict
    if described is None:
        assert verdict.changes == () and target == deployed
        return
    assert [change.describe() for change in verdict.changes] == [described]
    answer = run_check(CLUSTER, deployed, target, python=pcluster_python)
    # What up sends after its fleet stop is what ParallelCluster accepts then.
    assert answer["stopped"]["allowed"] is True
    assert answer["running"]["allowed"] is (need in (UpdateNeed.IN_PLACE, UpdateNeed.DRAIN))


def test_the_fleet_stop_line_names_the_change_and_parallelclusters_reason(
    pcluster_python, deployed
):
    verdict = check_update(CLUSTER, deployed, rendered(nodes=1), python=pcluster_python)
    assert verdict.line() == (
        "cluster update: a fleet stop: up checkpoints and holds the jobs, stops the compute "
        "fleet, updates the cluster, starts the fleet and releases the jobs "
        "(Scheduling.SlurmQueues[gpu].ComputeResources[p4d-24xlarge].MaxCount 2 -> 1; "
        "ParallelCluster: All compute nodes must be stopped or QueueUpdateStrategy must be "
        "set to TERMINATE)"
    )


def test_a_change_refused_even_with_the_fleet_stopped_is_a_replacement(pcluster_python, deployed):
    # The head node's custom actions are set at its creation (update_policy UNSUPPORTED).
    target = json.loads(json.dumps(deployed))
    target["HeadNode"]["CustomActions"]["OnNodeConfigured"]["Args"].append("more")
    verdict = check_update(CLUSTER, deployed, target, python=pcluster_python)
    assert verdict.need is UpdateNeed.REPLACEMENT, verdict
    assert verdict.line().startswith("cluster update: a replacement: ParallelCluster refuses")
    assert "`down` the stack, then `up`" in verdict.line()


def test_no_deployed_cluster_is_a_creation_and_needs_no_check():
    assert check_update(CLUSTER, None, {}, python="/nonexistent").need is UpdateNeed.CREATE


def test_without_parallelclusters_package_the_update_stops_in_one_line(monkeypatch, tmp_path):
    monkeypatch.setenv("PCLUSTER_PYTHON", str(tmp_path / "missing" / "python"))
    with pytest.raises(ConfigError, match=r"run scripts/bootstrap .*nothing was changed$"):
        check_update(CLUSTER, {"Region": "us-east-1"}, {"Region": "us-east-1"})


@pytest.mark.parametrize(
    "name",
    [
        "gpu-training-stack-l4x1",
        "gpu-training-stack-l4_x1",
        "gpu-training-stack-l4.x1",
        "x" * 60,
        "x" * 61,
        "9abc",
        "a",
    ],
)
def test_the_cluster_name_rule_is_parallelclusters(pcluster_python, name):
    """ParallelCluster's own ClusterNameValidator (validators/cluster_validators.py) and the
    check the preview makes agree."""
    code = (
        "import sys\n"
        "from types import SimpleNamespace\n"
        "from pcluster.validators.cluster_validators import ClusterNameValidator\n"
        "v = ClusterNameValidator()\n"
        "failures = v.execute(name=sys.argv[1], scheduling=SimpleNamespace(scheduler='slurm',"
        " settings=SimpleNamespace(database=None)))\n"
        "print('refused' if failures else 'accepted')\n"
    )
    result = subprocess.run(
        [pcluster_python, "-c", code, name], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    try:
        check_cluster_name(name, "stack")
        ours = "accepted"
    except ConfigError:
        ours = "refused"
    assert ours == result.stdout.strip()
