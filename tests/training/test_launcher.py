"""The launcher's topology from TRAIN_* variables and its job exit code."""

from __future__ import annotations

import re

import pytest

from tests.training.jobs import run_job
from training.launcher import TopologyError, _job_exit_code, topology_from_env


def test_topology_defaults_to_one_cpu_node_with_two_workers():
    topo = topology_from_env({})
    assert (topo.nnodes, topo.node_rank, topo.nproc_per_node) == (1, 0, 2)
    assert (topo.master_addr, topo.master_port, topo.world_size) == ("127.0.0.1", 29500, 2)


def test_multi_node_topology_from_the_stack_variables():
    topo = topology_from_env(
        {
            "TRAIN_NNODES": "4",
            "TRAIN_NODE_RANK": "3",
            "TRAIN_NPROC_PER_NODE": "8",
            "TRAIN_MASTER_ADDR": "10.0.1.7",
            "TRAIN_MASTER_PORT": "29600",
        }
    )
    assert topo.world_size == 32
    assert (topo.node_rank, topo.master_addr, topo.master_port) == (3, "10.0.1.7", 29600)


@pytest.mark.parametrize(
    ("env", "words"),
    [
        ({"TRAIN_NNODES": "two"}, "TRAIN_NNODES = 'two' is not an integer"),
        ({"TRAIN_NNODES": "2", "TRAIN_NODE_RANK": "2"}, "TRAIN_NODE_RANK = 2 is outside 0..1"),
        ({"TRAIN_NPROC_PER_NODE": "0"}, "must both be at least 1"),
    ],
)
def test_bad_topology_is_refused(env, words):
    with pytest.raises(TopologyError, match=re.escape(words)):
        topology_from_env(env)


@pytest.mark.parametrize(
    ("codes", "job"),
    [
        ([75], 75),
        ([75, 75], 75),
        ([75, -15], 75),  # one rank checkpointed and exited, the other was stopped
        ([1, 75], 1),
        ([-9], 1),
        ([1], 1),
        ([2, 1], 2),
    ],
)
def test_job_exit_code_from_worker_codes(codes, job):
    assert _job_exit_code(codes) == job


@pytest.mark.slow
def test_a_failing_worker_makes_the_job_exit_1(tmp_path):
    """The user's model raises in the workers (after the launcher's checks passed)."""
    job = run_job(
        tmp_path,
        "model.builder=examples.custom_model.model:build",
        "model.options={hidden_size = -1}",
    )
    assert job.returncode == 1
    assert "Traceback" in job.stderr and "hidden_size" in job.stderr
    assert "a worker failed" in job.stderr
