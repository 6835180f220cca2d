"""The all-reduce figures the health gate holds a node to: one per multi-GPU instance type."""

from __future__ import annotations

import dataclasses

import pytest

from infra.errors import ConfigError
from infra.knowledge.allreduce import ALLREDUCE_FILE, load_allreduce, node_expectation
from infra.knowledge.catalog import load_catalog
from training.health.expectation import NodeExpectation

CATALOG = load_catalog()
FIGURES = load_allreduce(CATALOG.instances)


def test_every_instance_type_with_several_gpus_has_a_sourced_figure():
    several = {name for name, entry in CATALOG.instances.items() if entry.gpu_count > 1}
    assert several == set(FIGURES)
    assert {"p4d.24xlarge", "p5.48xlarge", "g5.12xlarge", "p3.8xlarge"} <= several
    for name, figure in FIGURES.items():
        assert figure.sources.busbw_gbps.startswith(figure.basis), name
        if figure.basis == "measured":
            assert "https://github.com/NVIDIA/" in figure.sources.busbw_gbps, name


def test_the_published_runs():
    # One p4d, nccl-tests at 1 GiB: 230.77 GB/s (NVIDIA/nccl issue 527); a p5 without
    # NVLink SHARP: 370 GB/s (NVIDIA/nccl issue 1442).
    assert FIGURES["p4d.24xlarge"].busbw_gbps == 230.0
    assert FIGURES["p5.48xlarge"].busbw_gbps == 370.0


def test_a_multi_gpu_type_without_a_figure_is_refused(tmp_path):
    path = tmp_path / "allreduce.toml"
    text = ALLREDUCE_FILE.read_text()
    path.write_text(text.split('[allreduce."p4d.24xlarge"]')[0])
    with pytest.raises(
        ConfigError, match=r"no all-reduce figure for .*p4d\.24xlarge.*p5\.48xlarge"
    ):
        load_allreduce(CATALOG.instances, path)


def test_a_figure_for_an_unknown_type_is_refused(tmp_path):
    path = tmp_path / "allreduce.toml"
    path.write_text(
        ALLREDUCE_FILE.read_text()
        + '\n[allreduce."p9.huge"]\nbusbw_gbps = 1.0\nbasis = "measured"\n'
        + '[allreduce."p9.huge".sources]\nbusbw_gbps = "measured: x"\n'
    )
    with pytest.raises(ConfigError, match=r"allreduce 'p9\.huge': not an instance type"):
        load_allreduce(CATALOG.instances, path)


def test_what_the_gate_expects_of_a_node():
    p4d, single = CATALOG.instance("p4d.24xlarge"), CATALOG.instance("g5.xlarge")
    assert node_expectation(p4d, efa_attached=True) == NodeExpectation(
        gpus=8, gpu_model="A100", busbw_gbps=230.0, efa_devices=4, fabric_busbw_gbps=76.0
    )
    # Without EFA attached, neither the devices nor the bandwidth between nodes over them.
    without = node_expectation(p4d, efa_attached=False, figures=FIGURES)
    assert (without.efa_devices, without.fabric_busbw_gbps) == (None, None)
    assert dataclasses.astuple(node_expectation(single, efa_attached=False, figures=FIGURES)) == (
        1,
        "A10G",
        None,
        None,
        None,
    )


def test_the_published_two_node_runs_over_efa():
    # nccl-tests across 2 nodes at 1 GiB (aws-samples/awsome-distributed-training,
    # micro-benchmarks/nccl-tests/README.md): 76.79 GB/s on p4de, 436.95 GB/s on p5.
    assert FIGURES["p4de.24xlarge"].fabric_busbw_gbps == 76.0
    assert FIGURES["p5.48xlarge"].fabric_busbw_gbps == 435.0
    for name, figure in FIGURES.items():
        if figure.fabric_busbw_gbps is not None:
            assert CATALOG.instances[name].efa_interfaces > 0, name
            assert "awsome-distributed-training" in figure.sources.fabric_busbw_gbps, name


def test_a_fabric_figure_without_its_source_is_refused(tmp_path):
    path = tmp_path / "allreduce.toml"
    source = FIGURES["p5.48xlarge"].sources.fabric_busbw_gbps
    path.write_text(ALLREDUCE_FILE.read_text().replace(f'fabric_busbw_gbps = "{source}"\n', ""))
    with pytest.raises(ConfigError, match=r"fabric_busbw_gbps needs sources\.fabric_busbw_gbps"):
        load_allreduce(CATALOG.instances, path)
