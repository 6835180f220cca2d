"""Node layout: EFA interfaces per AWS's multi-card guide, root device, multi-node wiring."""

from __future__ import annotations

from infra.components.compute import interface_layout
from infra.knowledge.catalog import load_catalog
from infra.knowledge.resolver import resolve
from tests.support.stack_runs import (
    INSTANCE,
    LAUNCH_TEMPLATE,
    boot_env,
    nodes_in_rank_order,
    run_stack,
)


def kinds(plan) -> list[tuple[int, int, str | None]]:
    return [
        (i.network_card_index, i.device_index, i.interface_type) for i in interface_layout(plan)
    ]


def test_single_node_gets_one_plain_interface_even_on_an_efa_type():
    assert kinds(resolve("p4d.24xlarge", nodes=1)) == [(0, 0, None)]


def test_p4d_multi_node_gets_four_efa_interfaces_one_per_card():
    assert kinds(resolve("p4d.24xlarge", nodes=2)) == [
        (0, 0, "efa"),
        (1, 1, "efa"),
        (2, 1, "efa"),
        (3, 1, "efa"),
    ]


def test_p5_multi_node_gets_32_cards_with_efa_only_secondaries():
    layout = kinds(resolve("p5.48xlarge", nodes=2))
    assert len(layout) == 32
    # The primary interface cannot be EFA-only: it carries the node's IP traffic.
    assert layout[0] == (0, 0, "efa")
    assert layout[1:] == [(card, 1, "efa-only") for card in range(1, 32)]


def test_multi_node_without_efa_keeps_one_plain_interface():
    assert kinds(resolve("p3.2xlarge", nodes=2)) == [(0, 0, None)]


def test_only_families_documented_efa_only_get_efa_only_secondaries():
    for instance in load_catalog().instances.values():
        if instance.efa_interfaces < 2:
            continue
        layout = kinds(resolve(instance.type, nodes=2))
        expected = "efa-only" if instance.type.startswith("p5") else "efa"
        assert {kind for _, _, kind in layout[1:]} == {expected}, instance.type


def test_root_volume_is_mapped_on_the_amis_root_device():
    # Both profiles boot Amazon Linux (2023 and 2), whose AMIs name the root /dev/xvda.
    for profile in ("a100x8", "v100x1"):
        (root,) = run_stack(profile=profile).one(LAUNCH_TEMPLATE).inputs["blockDeviceMappings"]
        assert root["deviceName"] == "/dev/xvda"


def test_p5_stack_lays_out_32_interfaces_with_elastic_ips_and_node0_as_master():
    run = run_stack(instanceType="p5.48xlarge", nodes=3)
    interfaces = run.one(LAUNCH_TEMPLATE).inputs["networkInterfaces"]
    assert len(interfaces) == 32
    assert sum(i["interfaceType"] == "efa-only" for i in interfaces) == 31
    # More than one interface: EC2 assigns no public address, so each node gets an Elastic IP.
    assert all("associatePublicIpAddress" not in i for i in interfaces)
    nodes = nodes_in_rank_order(run)
    eips = run.of_type("aws:ec2/eip:Eip")
    assert sorted(e.inputs["networkInterface"] for e in eips) == sorted(
        n.state["primaryNetworkInterfaceId"] for n in nodes
    )
    master = nodes[0].state["privateIp"]
    assert [boot_env(n)["TRAIN_MASTER_ADDR"] for n in nodes] == ["127.0.0.1", master, master]
    assert [boot_env(n)["TRAIN_NODE_RANK"] for n in nodes] == ["0", "1", "2"]
    assert len(run.of_type(INSTANCE)) == 3


def test_root_volume_size_follows_the_config():
    run = run_stack(rootVolumeGiB=1200)
    (root,) = run.one(LAUNCH_TEMPLATE).inputs["blockDeviceMappings"]
    assert root["ebs"]["volumeSize"] == 1200
