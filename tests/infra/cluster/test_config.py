"""The ParallelCluster config of every profile, loaded with ParallelCluster's own schema.

The schema is the `aws-parallelcluster` package's ClusterSchema, in its own
virtualenv (.venv-pcluster: its pins clash with pulumi's), run in a subprocess
with a region and dummy credentials, and no AWS call.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from common.market import Market
from infra.cluster.config import SETUP_SCRIPT, ClusterSettings, cluster_config
from infra.knowledge.parallelcluster import load_parallelcluster
from infra.knowledge.profiles import load_profiles
from infra.knowledge.resolver import resolve
from tests.support.tools import _unavailable, require_tool
from tests.training.multirank import REPO_ROOT

SCHEMA_SCRIPT = Path(__file__).with_name("pcluster_schema.py")
PARALLELCLUSTER = load_parallelcluster()


def settings(**changes) -> ClusterSettings:
    values = {
        "region": "us-east-1",
        "subnet_id": "subnet-0123456789abcdef0",
        "bucket": "gpu-stack-test-artifacts",
        "setup_script": "s3://gpu-stack-test-artifacts/cluster/setup-node.sh",
        "job_script": "s3://gpu-stack-test-artifacts/cluster/train.sbatch",
        "epilog": "s3://gpu-stack-test-artifacts/cluster/node-verdicts.epilog",
        "node_policy_arn": (
            "arn:aws:iam::123456789012:policy/parallelcluster/gpu-stack-test-cluster-nodes-1a2b3c4"
        ),
        "registry": "123456789012.dkr.ecr.us-east-1.amazonaws.com",
        "head_node": PARALLELCLUSTER.head_node,
        "ssh_allowed_cidr": "10.42.0.0/16",
        "tags": {"gpu-stack": "test"},
        **changes,
    }
    return ClusterSettings(**values)


@pytest.fixture(scope="module")
def pcluster_python() -> str:
    """The interpreter of .venv-pcluster (scripts/bootstrap makes it), or PCLUSTER_PYTHON."""
    python = os.environ.get("PCLUSTER_PYTHON") or str(
        REPO_ROOT / ".venv-pcluster" / "bin" / "python"
    )
    if not Path(python).is_file():
        _unavailable(
            f"no ParallelCluster schema interpreter at {python}: run scripts/bootstrap "
            "(python3 -m venv .venv-pcluster && .venv-pcluster/bin/pip install -r "
            "requirements-pcluster.txt)"
        )
    return python


def _plans() -> dict[str, object]:
    return {
        f"{name}-{version}": resolve(
            profile.instance_type, profile.variant, nodes=2, cluster=release
        )
        for name, profile in load_profiles().profiles.items()
        for version, release in PARALLELCLUSTER.releases.items()
    }


PLANS = _plans()
CAPACITIES = {
    "spot": {"market": Market.SPOT},
    "on-demand": {"market": Market.ON_DEMAND},
    "capacity-block": {
        "market": Market.CAPACITY_BLOCK,
        "capacity_block_id": "cr-0123456789abcdef0",
    },
}
# A mistake in a p4d spot cluster's config: where, what is changed, the line the schema gives.
MISTAKES = {
    "misspelt-min-count": (
        ("Scheduling", "SlurmQueues", 0, "ComputeResources", 0),
        lambda resource: resource.update(MinCoun=resource.pop("MinCount")),
        "Scheduling.SlurmQueues[0].ComputeResources[0].MinCoun: Unknown field.",
    ),
    "impossible-capacity-type": (
        ("Scheduling", "SlurmQueues", 0),
        lambda queue: queue.update(CapacityType="SPOTTY"),
        "Scheduling.SlurmQueues[0].CapacityType: Must be one of: CAPACITY_BLOCK, ONDEMAND, SPOT.",
    ),
    "misspelt-head-node-type": (
        ("HeadNode",),
        lambda head: head.update(InstanceTyp=head.pop("InstanceType")),
        "HeadNode.InstanceTyp: Unknown field.",
    ),
}


def _mistaken_config(path, change) -> dict:
    plan = resolve("p4d.24xlarge", nodes=2, cluster=PARALLELCLUSTER.release())
    config = copy.deepcopy(cluster_config(plan, settings(market=Market.SPOT)))
    target = config
    for key in path:
        target = target[key]
    change(target)
    return config


@pytest.fixture(scope="module")
def verdicts(pcluster_python) -> dict[str, str]:
    """ParallelCluster's verdict on every config these tests check, from one process:
    "valid", or its one-line error."""
    configs = {
        f"{plan_id}/{capacity_id}": cluster_config(plan, settings(**capacity))
        for plan_id, plan in PLANS.items()
        for capacity_id, capacity in CAPACITIES.items()
    }
    configs |= {
        name: _mistaken_config(path, change) for name, (path, change, _) in MISTAKES.items()
    }
    env = {
        "PATH": os.environ.get("PATH", ""),
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
    }
    result = subprocess.run(
        [pcluster_python, str(SCHEMA_SCRIPT), "gpu-stack-test"],
        input=yaml.safe_dump(configs),
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)


@pytest.mark.parametrize("plan_id", PLANS)
@pytest.mark.parametrize("capacity_id", CAPACITIES)
def test_every_profile_config_loads_with_parallelclusters_schema(verdicts, plan_id, capacity_id):
    plan = PLANS[plan_id]
    assert verdicts[f"{plan_id}/{capacity_id}"] == "valid"

    config = cluster_config(plan, settings(**CAPACITIES[capacity_id]))
    (queue,) = config["Scheduling"]["SlurmQueues"]
    (resource,) = queue["ComputeResources"]
    assert resource["InstanceType"] == plan.instance.type
    assert resource["MaxCount"] == 2
    assert ("Efa" in resource) == (plan.instance.efa_interfaces > 0)


def test_the_queue_scales_to_zero_spot_or_on_demand():
    plan = resolve("p4d.24xlarge", nodes=4, cluster=PARALLELCLUSTER.release())
    spot = cluster_config(plan, settings(market=Market.SPOT))["Scheduling"]["SlurmQueues"][0]
    on_demand = cluster_config(plan, settings(market=Market.ON_DEMAND))["Scheduling"][
        "SlurmQueues"
    ][0]
    assert (spot["CapacityType"], on_demand["CapacityType"]) == ("SPOT", "ONDEMAND")
    resource = spot["ComputeResources"][0]
    assert (resource["MinCount"], resource["MaxCount"]) == (0, 4)
    # p4d.24xlarge has 4 EFA interfaces (AWS EC2 P4 instance table): GPUDirect RDMA on.
    assert resource["Efa"] == {"Enabled": True, "GdrSupport": True}
    assert spot["Networking"]["PlacementGroup"] == {"Enabled": True}
    assert spot["HealthChecks"] == {"Gpu": {"Enabled": True}}


def test_each_market_has_its_queues_capacity_type():
    plan = resolve("p4d.24xlarge", nodes=2, cluster=PARALLELCLUSTER.release())
    # Scheduling-v3.html, CapacityType: ONDEMAND, SPOT or CAPACITY_BLOCK; a capacity
    # reservation's instances are on-demand ones.
    expected = {
        Market.ON_DEMAND: "ONDEMAND",
        Market.SPOT: "SPOT",
        Market.RESERVATION: "ONDEMAND",
        Market.CAPACITY_BLOCK: "CAPACITY_BLOCK",
    }
    for market, capacity_type in expected.items():
        block = "cr-0123456789abcdef0" if market is Market.CAPACITY_BLOCK else None
        config = cluster_config(plan, settings(market=market, capacity_block_id=block))
        assert config["Scheduling"]["SlurmQueues"][0]["CapacityType"] == capacity_type


def test_a_capacity_block_has_static_nodes_and_no_placement_group():
    plan = resolve("p4d.24xlarge", nodes=2, cluster=PARALLELCLUSTER.release())
    config = cluster_config(
        plan, settings(market=Market.CAPACITY_BLOCK, capacity_block_id="cr-0123456789abcdef0")
    )
    queue = config["Scheduling"]["SlurmQueues"][0]
    assert queue["CapacityType"] == "CAPACITY_BLOCK"
    assert "PlacementGroup" not in queue["Networking"]
    resource = queue["ComputeResources"][0]
    assert (resource["MinCount"], resource["MaxCount"]) == (2, 2)
    assert resource["CapacityReservationTarget"] == {
        "CapacityReservationId": "cr-0123456789abcdef0"
    }


def test_slurm_requeues_the_trainers_interrupted_exit_code_and_waits_for_its_checkpoint():
    """75 = interrupted and checkpointed (docs/contracts.md, section 3); a stopped job gets
    the 100 s the single-node unit gives it (docker stop --time 100) before SIGKILL."""
    plan = resolve("g6e.12xlarge", nodes=2, cluster=PARALLELCLUSTER.release())
    slurm = cluster_config(plan, settings())["Scheduling"]["SlurmSettings"]
    assert slurm["CustomSlurmSettings"] == [{"RequeueExit": "75"}, {"KillWait": "120"}]
    assert slurm["ScaledownIdletime"] == 10


@pytest.mark.parametrize("mistake", MISTAKES)
def test_a_misspelt_or_impossible_setting_fails_in_one_line_naming_the_key(verdicts, mistake):
    assert verdicts[mistake] == MISTAKES[mistake][2]


def test_the_node_setup_script_is_clean_shell_and_refuses_an_unknown_role(tmp_path):
    shellcheck = require_tool("shellcheck", "shellcheck")
    lint = subprocess.run([shellcheck, str(SETUP_SCRIPT)], capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout
    # ParallelCluster passes the role as the first argument (cluster_config's Args).
    plan = resolve("p4d.24xlarge", nodes=2, cluster=PARALLELCLUSTER.release())
    config = cluster_config(plan, settings())
    head = config["HeadNode"]["CustomActions"]["OnNodeConfigured"]
    compute = config["Scheduling"]["SlurmQueues"][0]["CustomActions"]["OnNodeConfigured"]
    assert (head["Args"][0], compute["Args"][0]) == ("head", "compute")
    assert head["Script"] == compute["Script"] == settings().setup_script
    wrong = subprocess.run(["bash", str(SETUP_SCRIPT), "login"], capture_output=True, text=True)
    assert wrong.returncode == 2 and "unknown role login" in wrong.stderr
