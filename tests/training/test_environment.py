"""The launcher's checks of TRAIN_* values and its choice of rendezvous port."""

from __future__ import annotations

import socket

import pytest

from training.contract import DEFAULT_MASTER_PORT
from training.environment import check_environment, rendezvous_port
from training.launcher import TopologyError, topology_from_env


def test_a_single_node_without_a_port_takes_a_free_one():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        ports = {rendezvous_port(topology_from_env({}), {}).master_port for _ in range(3)}
    assert taken not in ports and DEFAULT_MASTER_PORT not in ports
    for port in ports:
        with socket.socket() as probe:
            probe.bind(("", port))  # it was free


def test_several_nodes_keep_the_configured_port():
    env = {"TRAIN_NNODES": "2", "TRAIN_NODE_RANK": "1", "TRAIN_MASTER_ADDR": "10.0.0.1"}
    assert rendezvous_port(topology_from_env(env), env).master_port == DEFAULT_MASTER_PORT


@pytest.mark.parametrize(
    "env",
    [
        {"TRAIN_MASTER_PORT": "0"},
        {"TRAIN_MASTER_PORT": "65536"},
        {"TRAIN_MASTER_ADDR": "http://node0"},
        {"TRAIN_MASTER_ADDR": "node 0"},
        {"TRAIN_S3_URI": "s3://ab/prefix"},
        {"TRAIN_SPOT_ENDPOINT": "localhost:1338"},
    ],
)
def test_bad_values_are_refused(env):
    with pytest.raises(TopologyError, match=next(iter(env))):
        check_environment(env)


@pytest.mark.parametrize(
    "env",
    [
        {"TRAIN_MASTER_PORT": "29600", "TRAIN_MASTER_ADDR": "10.0.1.7"},
        {"TRAIN_MASTER_ADDR": "ip-10-0-1-7.ec2.internal"},
        {"TRAIN_MASTER_ADDR": "fd00::1"},
        {"TRAIN_S3_URI": "s3://stack-checkpoints/checkpoints"},
        {"TRAIN_SPOT_ENDPOINT": ""},
        {"TRAIN_SPOT_ENDPOINT": "http://127.0.0.1:1338"},
    ],
)
def test_good_values_pass(env):
    check_environment(env)


def test_an_unknown_train_variable_is_warned_about(caplog):
    check_environment({"TRAIN_NPROCS": "8"})
    assert "TRAIN_NPROCS is not a variable the trainer reads" in caplog.text
