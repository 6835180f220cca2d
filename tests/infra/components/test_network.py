"""Network: own VPC or the default one, the zone that offers the type, SSH only when asked."""

from __future__ import annotations

import pulumi
import pytest

from infra.components.zone import KeptZoneProvider
from infra.dryrun.mocks import RecordingMocks
from tests.support.mock_runs import of_type, one
from tests.support.stack_runs import LAUNCH_TEMPLATE, SECURITY_GROUP, run_stack


def test_own_vpc_has_a_public_subnet_route_to_the_gateway_and_an_s3_endpoint():
    run = run_stack()
    vpc = one(run, "aws:ec2/vpc:Vpc")
    subnet = one(run, "aws:ec2/subnet:Subnet")
    assert subnet.inputs["vpcId"] == vpc.id
    routes = one(run, "aws:ec2/routeTable:RouteTable")
    gateway = one(run, "aws:ec2/internetGateway:InternetGateway")
    assert routes.inputs["routes"] == [{"cidrBlock": "0.0.0.0/0", "gatewayId": gateway.id}]
    endpoint = one(run, "aws:ec2/vpcEndpoint:VpcEndpoint")
    assert endpoint.inputs["serviceName"] == "com.amazonaws.us-east-1.s3"
    assert endpoint.inputs["vpcEndpointType"] == "Gateway"
    assert endpoint.inputs["routeTableIds"] == [routes.id]
    (interface,) = one(run, LAUNCH_TEMPLATE).inputs["networkInterfaces"]
    assert interface["subnetId"] == subnet.id


def test_default_vpc_when_asked():
    run = run_stack(useDefaultVpc=True, availabilityZone="us-east-1c")
    assert of_type(run, "aws:ec2/vpc:Vpc") == [] and of_type(run, "aws:ec2/subnet:Subnet") == []
    assert one(run, SECURITY_GROUP).inputs["vpcId"] == "vpc-default"
    (interface,) = one(run, LAUNCH_TEMPLATE).inputs["networkInterfaces"]
    assert interface["subnetId"] == "subnet-default-us-east-1c"


def test_ssh_opens_only_to_the_configured_cidr():
    run = run_stack(sshCidr="203.0.113.7/32")
    (rule,) = one(run, SECURITY_GROUP).inputs["ingress"]
    assert rule == rule | {"protocol": "tcp", "fromPort": 22, "toPort": 22}
    assert rule["cidrBlocks"] == ["203.0.113.7/32"]


def test_zone_defaults_to_the_first_that_offers_the_type():
    run = run_stack(mocks=RecordingMocks(offering_zones=("us-east-1d", "us-east-1b")))
    assert one(run, "aws:ec2/subnet:Subnet").inputs["availabilityZone"] == "us-east-1b"
    assert one(run, LAUNCH_TEMPLATE).inputs["placement"]["availabilityZone"] == "us-east-1b"
    assert run.outputs["availability_zone"] == "us-east-1b"


def test_configured_zone_without_the_type_is_refused():
    mocks = RecordingMocks(offering_zones=("us-east-1b",))
    with pytest.raises(pulumi.RunError, match=r"gpu:availabilityZone: 'us-east-1a' does not offer"):
        run_stack(mocks=mocks, availabilityZone="us-east-1a")
    assert not any(r.type.startswith("aws:ec2/") for r in mocks.resources)


def test_a_recomputed_first_choice_keeps_the_zone_of_the_first_up():
    kept = {"zone": "us-east-1a", "configured": False}
    provider = KeptZoneProvider()
    assert provider.create(kept).outs["zone"] == "us-east-1a"
    # AWS now offers the type first in us-east-1b: not a change, the stack stays.
    assert not provider.diff(
        "us-east-1a", kept, {"zone": "us-east-1b", "configured": False}
    ).changes


def test_a_configured_zone_moves_the_stack():
    old = {"zone": "us-east-1a", "configured": False}
    diff = KeptZoneProvider().diff("us-east-1a", old, {"zone": "us-east-1c", "configured": True})
    assert diff.changes and diff.replaces == ["zone"]


def test_no_resource_name_holds_the_zone_and_the_subnet_keeps_its_old_name_as_an_alias():
    run = run_stack(mocks=RecordingMocks(offering_zones=("us-east-1d", "us-east-1b")))
    assert not any("us-east-1" in resource.name for resource in run.resources)
    subnet = one(run, "aws:ec2/subnet:Subnet")
    assert run.aliases[f"{subnet.type} {subnet.name}"] == [f"{subnet.name}-us-east-1b"]
    (zone,) = [
        r for r in of_type(run, "pulumi-python:dynamic:Resource") if r.name.endswith("-zone")
    ]
    assert subnet.inputs["availabilityZone"] == zone.state["zone"] == "us-east-1b"
