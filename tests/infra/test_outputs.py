"""The stack outputs' one definition (infra/outputs.py) against what both stack kinds export."""

from __future__ import annotations

import pytest

from infra.errors import ConfigError
from infra.outputs import (
    CLUSTER,
    SINGLE_NODE,
    ClusterOutputs,
    SingleNodeOutputs,
    read_outputs,
    written_by,
)
from tests.infra.commands.conftest import cluster_outputs, stack_outputs
from tests.support.stack_runs import run_stack

# What the commands read (infra/commands/*), written out here so a renamed field fails.
READ_FROM_BOTH = {
    "cost_tag",
    "market",
    "nodes",
    "instance_type",
    "image_uri",
    "checkpoint_bucket",
    "checkpoint_uri",
    "hourly_cost_usd",
    "monthly_budget_usd",
    "spend_ledger_table",
}
READ_FROM_SINGLE_NODE = {"instance_ids", "log_group"}
READ_FROM_CLUSTER = {
    "cluster_name",
    "head_node",
    "queue",
    "submit_command",
    "idle_usd_per_hour",
    "cluster_log_group_prefix",
}


@pytest.fixture(scope="module")
def single_node_spot():
    return run_stack(profile="l4x1", spot=True)


@pytest.fixture(scope="module")
def cluster():
    return run_stack(cluster="slurm", nodes=2, spot=True)


def test_the_single_node_stack_exports_every_field_it_owns_and_reads_back(single_node_spot):
    exported = set(single_node_spot.outputs)
    assert exported == written_by(SINGLE_NODE)
    assert exported >= READ_FROM_BOTH | READ_FROM_SINGLE_NODE
    assert not READ_FROM_CLUSTER & exported
    outputs = read_outputs("test", single_node_spot.outputs)
    assert isinstance(outputs, SingleNodeOutputs) and len(outputs.instance_ids) == 1
    assert outputs.market == "spot"


def test_an_on_demand_stack_has_no_spot_requests_to_cancel():
    exported = set(run_stack(profile="l4x1", spot=False).outputs)
    assert exported == written_by(SINGLE_NODE) - {"cancel_spot_requests"}


def test_the_cluster_stack_exports_every_field_it_owns_and_reads_back(cluster):
    exported = set(cluster.outputs)
    assert exported == written_by(CLUSTER)
    assert exported >= READ_FROM_BOTH | READ_FROM_CLUSTER
    assert not READ_FROM_SINGLE_NODE & exported
    outputs = read_outputs("test", cluster.outputs)
    assert isinstance(outputs, ClusterOutputs) and outputs.queue == "gpu" and outputs.nodes == 2


def test_both_kinds_write_the_shared_fields(single_node_spot, cluster):
    both = set(single_node_spot.outputs) & set(cluster.outputs)
    assert both >= READ_FROM_BOTH
    # Every field with no kind of its own is written by both.
    assert written_by(SINGLE_NODE) & written_by(CLUSTER) == both


def test_a_missing_output_names_it_and_how_to_add_it():
    values = stack_outputs(["i-0"], spot=False)
    del values["cost_tag"]
    with pytest.raises(ConfigError) as error:
        read_outputs("l4x1", values)
    assert str(error.value).startswith("stack l4x1 has no output 'cost_tag'")
    assert "`python -m infra up l4x1` writes it" in str(error.value)


def test_a_renamed_output_is_missing_under_its_new_name():
    values = cluster_outputs(head_node="i-0head")
    values["checkpoint_s3_uri"] = values.pop("checkpoint_uri")  # an older program's name
    with pytest.raises(ConfigError, match="stack a100x8 has no output 'checkpoint_uri'"):
        read_outputs("a100x8", values)


def test_a_value_of_the_wrong_type_is_refused():
    values = stack_outputs(["i-0"], spot=False, nodes="two")
    with pytest.raises(ConfigError, match="stack l4x1 has a malformed output 'nodes'"):
        read_outputs("l4x1", values)


def test_outputs_a_newer_program_writes_are_ignored():
    values = stack_outputs(["i-0"], spot=True, some_later_output="x")
    assert read_outputs("l4x1", values) == SingleNodeOutputs(**stack_outputs(["i-0"], spot=True))


def test_a_stack_without_its_kind_is_told_to_write_it():
    values = cluster_outputs()
    del values["kind"]  # a stack from before the outputs named their kind
    with pytest.raises(ConfigError, match="stack a100x8 has no output 'kind'"):
        read_outputs("a100x8", values)


def test_a_kinds_own_output_is_checked_under_its_name():
    values = stack_outputs(["i-0"], spot=False)
    del values["log_group"]
    with pytest.raises(ConfigError, match="stack l4x1 has no output 'log_group'"):
        read_outputs("l4x1", values)
    values = cluster_outputs(kind="ec2")  # a cluster's record under the other kind
    with pytest.raises(ConfigError, match="stack l4x1 has no output 'price_model'"):
        read_outputs("l4x1", values)
