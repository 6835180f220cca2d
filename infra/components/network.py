"""The stack's network: where the nodes live and what may reach them.

A VPC with one public subnet in the availability zone the nodes use, an internet
gateway for outbound traffic (ECR, S3, SSM, CloudWatch) and an S3 gateway
endpoint so checkpoint and image-layer traffic skips the internet; or the
account's default VPC when `gpu:useDefaultVpc` asks. One security group: nothing
inbound (SSH only from `gpu:sshCidr`, when set). A Slurm cluster's nodes get the
security groups ParallelCluster makes for them, in the same subnet.
"""

from __future__ import annotations

import ipaddress

import pulumi
import pulumi_aws as aws

from infra.errors import ConfigError

VPC_CIDR = "10.42.0.0/16"
# /20: 4091 usable addresses; a Slurm cluster's p5 node with EFA on every card may use 32.
SUBNET_CIDR = "10.42.0.0/20"


class Network(pulumi.ComponentResource):
    """VPC, subnet, routes and the nodes' security group."""

    vpc_id: pulumi.Output[str]
    subnet_id: pulumi.Output[str]
    security_group_id: pulumi.Output[str]
    availability_zone: str

    def __init__(
        self,
        name: str,
        *,
        instance_type: str,
        availability_zone: str | None,
        use_default_vpc: bool,
        ssh_cidr: ipaddress.IPv4Network | None,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("gpu:infra:Network", name, None, opts)
        invoke = pulumi.InvokeOptions(parent=self)
        self.availability_zone = _pick_zone(instance_type, availability_zone, invoke)
        child = pulumi.ResourceOptions(parent=self)

        if use_default_vpc:
            vpc = aws.ec2.get_vpc(default=True, opts=invoke)
            subnet = aws.ec2.get_subnet(
                vpc_id=vpc.id,
                availability_zone=self.availability_zone,
                default_for_az=True,
                opts=invoke,
            )
            self.vpc_id = pulumi.Output.from_input(vpc.id)
            self.subnet_id = pulumi.Output.from_input(subnet.id)
        else:
            self._create_vpc(name, child)

        ingress = []
        if ssh_cidr is not None:
            ingress.append(
                {
                    "protocol": "tcp",
                    "from_port": 22,
                    "to_port": 22,
                    "cidr_blocks": [str(ssh_cidr)],
                    "description": "SSH from gpu:sshCidr",
                }
            )
        security_group = aws.ec2.SecurityGroup(
            f"{name}-nodes",
            description="GPU training nodes: no inbound from the internet",
            vpc_id=self.vpc_id,
            ingress=ingress,
            egress=[
                {
                    "protocol": "-1",
                    "from_port": 0,
                    "to_port": 0,
                    "cidr_blocks": ["0.0.0.0/0"],
                    "description": "outbound: ECR, S3, SSM, CloudWatch, the other nodes",
                }
            ],
            opts=child,
        )
        self.security_group_id = security_group.id
        self.register_outputs(
            {
                "vpc_id": self.vpc_id,
                "subnet_id": self.subnet_id,
                "security_group_id": self.security_group_id,
                "availability_zone": self.availability_zone,
            }
        )

    def _create_vpc(self, name: str, child: pulumi.ResourceOptions) -> None:
        vpc = aws.ec2.Vpc(
            f"{name}-vpc",
            cidr_block=VPC_CIDR,
            enable_dns_support=True,
            enable_dns_hostnames=True,  # SSM and ECR endpoints resolve by name
            tags={"Name": f"{name}-vpc"},
            opts=child,
        )
        gateway = aws.ec2.InternetGateway(f"{name}-igw", vpc_id=vpc.id, opts=child)
        subnet = aws.ec2.Subnet(
            f"{name}-public-{self.availability_zone}",
            vpc_id=vpc.id,
            cidr_block=SUBNET_CIDR,
            availability_zone=self.availability_zone,
            tags={"Name": f"{name}-public-{self.availability_zone}"},
            opts=child,
        )
        routes = aws.ec2.RouteTable(
            f"{name}-public",
            vpc_id=vpc.id,
            routes=[{"cidr_block": "0.0.0.0/0", "gateway_id": gateway.id}],
            opts=child,
        )
        aws.ec2.RouteTableAssociation(
            f"{name}-public-{self.availability_zone}",
            subnet_id=subnet.id,
            route_table_id=routes.id,
            opts=child,
        )
        region = aws.get_region_output(opts=pulumi.InvokeOutputOptions(parent=self))
        # Checkpoints and ECR image layers (served from S3) stay off the internet gateway.
        aws.ec2.VpcEndpoint(
            f"{name}-s3",
            vpc_id=vpc.id,
            service_name=region.region.apply(lambda r: f"com.amazonaws.{r}.s3"),
            vpc_endpoint_type="Gateway",
            route_table_ids=[routes.id],
            opts=child,
        )
        self.vpc_id = vpc.id
        self.subnet_id = subnet.id


def _pick_zone(instance_type: str, requested: str | None, invoke: pulumi.InvokeOptions) -> str:
    """The configured zone if it offers the instance type, else the first zone that does.

    GPU types are offered in only some zones of a region; a launch in another zone
    fails late with "Unsupported".
    """
    offered = sorted(
        aws.ec2.get_instance_type_offerings(
            location_type="availability-zone",
            filters=[{"name": "instance-type", "values": [instance_type]}],
            opts=invoke,
        ).locations
    )
    if not offered:
        raise ConfigError(
            f"{instance_type} is not offered in any availability zone of this region; "
            "pick another region (aws:region) or instance type (gpu:instanceType)"
        )
    if requested is None:
        return offered[0]
    if requested not in offered:
        raise ConfigError(
            f"gpu:availabilityZone: {requested!r} does not offer {instance_type}; "
            f"use one of {', '.join(offered)} or leave it unset"
        )
    return requested
