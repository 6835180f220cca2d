"""Node states read through spot requests, and the job stop over SSM."""

from __future__ import annotations

import pytest

from infra.deployed import nodes
from tests.infra.commands.conftest import launch_nodes


def _request(code: str) -> dict:
    """A DescribeSpotInstanceRequests entry, as the EC2 API reference shapes it."""
    return {"SpotInstanceRequestId": "sir-1", "InstanceId": "i-1", "Status": {"Code": code}}


@pytest.mark.parametrize(
    ("instance", "code", "expected"),
    [
        ("running", "fulfilled", "running"),
        ("running", "marked-for-stop", "interrupted"),
        ("stopping", "marked-for-stop", "interrupted"),
        ("stopped", "instance-stopped-no-capacity", "waiting for capacity"),
        ("stopped", "instance-stopped-by-price", "waiting for capacity"),
        ("stopped", "instance-stopped-by-user", "stopped"),
        ("pending", "fulfilled", "pending"),
    ],
)
def test_spot_status_codes_name_the_state(instance, code, expected):
    assert nodes.node_state(instance, _request(code)) == expected


def test_on_demand_nodes_keep_their_ec2_state():
    assert nodes.node_state("stopped", None) == "stopped"


def test_nodes_in_rank_order_with_their_requests(aws):
    ec2 = aws.client("ec2")
    ids = launch_nodes(ec2, 2, spot=True)
    found = nodes.nodes(ec2, ids)
    assert [(n.rank, n.instance_id, n.state) for n in found] == [
        (0, ids[0], "running"),
        (1, ids[1], "running"),
    ]
    assert all(n.spot_request.startswith("sir-") for n in found)


def test_stop_job_sends_the_unit_stop_and_waits_for_every_node(aws):
    ec2, ssm = aws.client("ec2"), aws.client("ssm")
    ids = launch_nodes(ec2, 2, spot=False)
    said = []
    assert nodes.stop_job(ssm, ids, say=said.append, sleep=lambda s: None) == {
        i: "Success" for i in ids
    }
    (command,) = ssm.list_commands()["Commands"]
    assert command["DocumentName"] == "AWS-RunShellScript"
    assert command["Parameters"]["commands"] == ["systemctl stop gpu-training"]
    assert sorted(command["InstanceIds"]) == sorted(ids)
    assert said and "checkpoints first" in said[0]


def test_an_instance_ec2_no_longer_knows_is_gone(aws):
    ec2 = aws.client("ec2")
    (known,) = launch_nodes(ec2, 1, spot=False)
    found = nodes.nodes(ec2, [known, "i-0123456789abcdef0"])
    assert [n.state for n in found] == ["running", "gone"]
