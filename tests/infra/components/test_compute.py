"""The node: root device, interface, market, replacement."""

from __future__ import annotations

import pulumi
import pytest

from infra.dryrun.mocks import RecordingMocks
from infra.dryrun.runner import PROJECT
from tests.support.infra import data_file_prices
from tests.support.mock_runs import of_type, one
from tests.support.stack_runs import (
    INSTANCE,
    LAUNCH_TEMPLATE,
    nodes_in_rank_order,
    run_stack,
)


def test_root_volume_is_mapped_on_the_amis_root_device():
    # Both profiles boot Amazon Linux (2023 and 2), whose AMIs name the root /dev/xvda.
    for profile in ("a100x8", "l4x1"):
        template = one(run_stack(profile=profile), LAUNCH_TEMPLATE)
        (root,) = template.inputs["blockDeviceMappings"]
        assert root["deviceName"] == "/dev/xvda"


def test_a_p5_node_has_one_plain_interface_and_its_own_public_address():
    # EFA interfaces and Elastic IPs serve multi-node jobs, which run on the Slurm cluster.
    run = run_stack(instanceType="p5.48xlarge")
    (interface,) = one(run, LAUNCH_TEMPLATE).inputs["networkInterfaces"]
    assert not interface.get("interfaceType")
    assert interface["associatePublicIpAddress"] == "true"
    assert of_type(run, "aws:ec2/eip:Eip") == []
    (node,) = nodes_in_rank_order(run)
    assert node.name.endswith("-test-node-0") and node.inputs["tags"]["gpu-node-rank"] == "0"


def test_root_volume_size_follows_the_config():
    run = run_stack(rootVolumeGiB=1200)
    (root,) = one(run, LAUNCH_TEMPLATE).inputs["blockDeviceMappings"]
    assert root["ebs"]["volumeSize"] == 1200


@pytest.mark.parametrize("spot", [False, True])
def test_a_node_is_replaced_delete_first_when_its_user_data_changes(spot):
    run = run_stack(spot=spot)
    (node,) = of_type(run, INSTANCE)
    assert node.inputs["userDataReplaceOnChange"] is True
    assert f"{node.type} {node.name}" in run.delete_before_replace


BLOCK = "cr-0123456789abcdef0"


def test_a_capacity_block_node_launches_into_the_block_with_its_market_type():
    run = run_stack(profile="a100x8", capacityBlockId=BLOCK)
    (node,) = of_type(run, INSTANCE)
    assert node.inputs["instanceMarketOptions"] == {"marketType": "capacity-block"}
    assert node.inputs["capacityReservationSpecification"] == {
        "capacityReservationTarget": {"capacityReservationId": BLOCK}
    }
    rate = data_file_prices("p4d.24xlarge").capacity_block_usd_per_hour
    assert run.outputs["market"] == "capacity-block"
    assert run.outputs["price_model"].startswith(f"Capacity Block {BLOCK}: paid up front")
    assert f"about ${rate:.2f}/h for 1 x p4d.24xlarge" in run.outputs["price_model"]


def test_a_capacity_reservation_node_targets_it_on_demand():
    run = run_stack(profile="a100x8", capacityReservationId=BLOCK)
    (node,) = of_type(run, INSTANCE)
    assert "instanceMarketOptions" not in node.inputs
    assert node.inputs["capacityReservationSpecification"] == {
        "capacityReservationTarget": {"capacityReservationId": BLOCK}
    }
    on_demand = data_file_prices("p4d.24xlarge").on_demand_usd_per_hour
    assert run.outputs["market"] == "reservation"
    assert f"${on_demand:.2f}/h (the on-demand rate)" in run.outputs["price_model"]


def test_a_plain_node_targets_no_reservation():
    (node,) = of_type(run_stack(), INSTANCE)
    assert "capacityReservationSpecification" not in node.inputs


@pytest.mark.parametrize(
    "config",
    [
        {"spot": True, "capacityBlockId": BLOCK},
        {"spot": True, "capacityReservationId": BLOCK},
        {"capacityBlockId": BLOCK, "capacityReservationId": BLOCK},
    ],
)
def test_two_ways_to_buy_a_node_are_refused_before_any_resource(config):
    mocks = RecordingMocks()
    with pytest.raises(pulumi.RunError, match="a node is bought one way only"):
        run_stack(mocks=mocks, **config)
    assert mocks.resources == []


@pytest.mark.parametrize("spot", [False, True])
def test_everything_the_launch_template_creates_carries_the_cost_tag(spot):
    run = run_stack(spot=spot)
    template = one(run, LAUNCH_TEMPLATE).inputs
    tagged = {spec["resourceType"]: spec["tags"] for spec in template["tagSpecifications"]}
    assert set(tagged) == {"instance", "volume", "network-interface", "spot-instances-request"}
    assert all(tags == {"gpu-stack": f"{PROJECT}-test"} for tags in tagged.values())
