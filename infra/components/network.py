"""The stack's network: where the nodes live and what may reach them.

A VPC with one public subnet in the availability zone the nodes use, an internet
gateway for outbound traffic (ECR, S3, SSM, CloudWatch) and an S3 gateway
endpoint so checkpoint and image-layer traffic skips the internet; or the
account's default VPC when `gpu:useDefaultVpc` asks. One security group: nothing
inbound from the internet (SSH only from `gpu:sshCidr`, when set).

The Slurm cluster (`private_subnet`) also gets a private subnet whose route out is
a NAT gateway in the public one: its nodes never hold a public IPv4 address.
ParallelCluster pre-creates the head node's network interface and gives it an
address only with HeadNode.Networking.ElasticIp
(aws-parallelcluster cli/src/pcluster/templates/cluster_stack.py, _add_head_eni,
tag v3.15.1), and EC2 assigns a public address only to an eth0 it creates at launch
(RunInstances, NetworkInterface.AssociatePublicIpAddress:
https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_InstanceNetworkInterfaceSpecification.html);
instances with several network cards (p4d, p4de, p5) take none at all
(https://docs.aws.amazon.com/parallelcluster/latest/ug/HeadNode-v3.html, SubnetId).
Yet the head node's bootstrap calls CloudFormation, EC2 and DynamoDB, and the compute
nodes call ECR's API, SSM and CloudWatch Logs. A NAT gateway reaches all of them for
$0.045/h plus $0.005/h for its public address (us-east-1); VPC interface endpoints for
the same list (ecr.api, ecr.dkr, logs, ssm, ssmmessages, ec2messages, ec2,
cloudformation, sts, plus a DynamoDB gateway) cost $0.01/h each per zone, $0.09/h, and
any API left off the list hangs a bootstrap (https://aws.amazon.com/vpc/pricing/,
https://aws.amazon.com/privatelink/pricing/). The S3 gateway endpoint (free) keeps
image layers and checkpoints off the NAT gateway's per-GB charge.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from infra.components.zone import KeptZone
from infra.knowledge.layout import choose_zone

VPC_CIDR = "10.42.0.0/16"
# /20: 4091 usable addresses, room for the Slurm cluster's nodes.
SUBNET_CIDR = "10.42.0.0/20"
PRIVATE_SUBNET_CIDR = "10.42.16.0/20"


@dataclass(frozen=True)
class NetworkArgs:
    instance_type: str  # the zone chosen must offer it
    availability_zone: str | None  # None: the first zone (by name) that offers the type
    use_default_vpc: bool
    ssh_cidr: ipaddress.IPv4Network | None
    # Nodes without a public address (the Slurm cluster): a private subnet and a NAT gateway.
    private_subnet: bool = False


class Network(pulumi.ComponentResource):
    """VPC, subnet, routes and the nodes' security group."""

    vpc_id: pulumi.Output[str]
    subnet_id: pulumi.Output[str]  # the private subnet when NetworkArgs.private_subnet
    security_group_id: pulumi.Output[str]
    availability_zone: pulumi.Output[str]
    # The private subnet's way out (its NAT gateway, route table and the table's association
    # with the subnet): what nodes there need before they boot. Empty without one.
    route_out: list[pulumi.Resource]

    def __init__(
        self,
        name: str,
        args: NetworkArgs,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("gpu:infra:Network", name, None, opts)
        invoke = pulumi.InvokeOptions(parent=self)
        chosen = choose_zone(
            args.instance_type, args.availability_zone, _offering_zones(args.instance_type, invoke)
        )
        child = pulumi.ResourceOptions(parent=self)
        # Chosen once, kept: a changed offering list must not move (replace) the stack.
        kept = KeptZone(
            f"{name}-zone",
            zone=chosen,
            configured=args.availability_zone is not None,
            opts=child,
        )
        self.availability_zone = kept.zone
        self.route_out = []
        # Earlier versions named the subnet after this run's choice; the alias keeps it.
        self._named_zone = chosen

        if args.use_default_vpc:
            if args.private_subnet:  # refused with the stack config (StackConfig)
                raise ValueError("a private subnet needs the stack's own VPC")
            vpc = aws.ec2.get_vpc(default=True, opts=invoke)
            subnet = aws.ec2.get_subnet_output(
                vpc_id=vpc.id,
                availability_zone=self.availability_zone,
                default_for_az=True,
                opts=pulumi.InvokeOutputOptions(parent=self),
            )
            self.vpc_id = pulumi.Output.from_input(vpc.id)
            self.subnet_id = subnet.id
        else:
            self._create_vpc(name, child, private_subnet=args.private_subnet)

        ingress = []
        if args.ssh_cidr is not None:
            ingress.append(
                {
                    "protocol": "tcp",
                    "from_port": 22,
                    "to_port": 22,
                    "cidr_blocks": [str(args.ssh_cidr)],
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

    def _create_vpc(
        self, name: str, child: pulumi.ResourceOptions, *, private_subnet: bool
    ) -> None:
        vpc = aws.ec2.Vpc(
            f"{name}-vpc",
            cidr_block=VPC_CIDR,
            enable_dns_support=True,
            enable_dns_hostnames=True,  # SSM and ECR endpoints resolve by name
            tags={"Name": f"{name}-vpc"},
            opts=child,
        )
        gateway = aws.ec2.InternetGateway(f"{name}-igw", vpc_id=vpc.id, opts=child)
        # The zone is no part of a name: a name is the resource's identity.
        renamed = pulumi.ResourceOptions(
            parent=self, aliases=[pulumi.Alias(name=f"{name}-public-{self._named_zone}")]
        )
        subnet = aws.ec2.Subnet(
            f"{name}-public",
            vpc_id=vpc.id,
            cidr_block=SUBNET_CIDR,
            availability_zone=self.availability_zone,
            tags={"Name": f"{name}-public"},
            opts=renamed,
        )
        routes = aws.ec2.RouteTable(
            f"{name}-public",
            vpc_id=vpc.id,
            routes=[{"cidr_block": "0.0.0.0/0", "gateway_id": gateway.id}],
            opts=child,
        )
        aws.ec2.RouteTableAssociation(
            f"{name}-public",
            subnet_id=subnet.id,
            route_table_id=routes.id,
            opts=renamed,
        )
        route_tables = [routes.id]
        self.vpc_id = vpc.id
        self.subnet_id = subnet.id
        if private_subnet:
            self.subnet_id = self._private_subnet(
                name, vpc.id, subnet.id, gateway, route_tables, child
            )
        region = aws.get_region_output(opts=pulumi.InvokeOutputOptions(parent=self))
        # Checkpoints and ECR image layers (served from S3) stay off the internet gateway
        # and the NAT gateway.
        aws.ec2.VpcEndpoint(
            f"{name}-s3",
            vpc_id=vpc.id,
            service_name=region.region.apply(lambda r: f"com.amazonaws.{r}.s3"),
            vpc_endpoint_type="Gateway",
            route_table_ids=route_tables,
            opts=child,
        )

    def _private_subnet(
        self,
        name: str,
        vpc_id: pulumi.Output[str],
        public_subnet_id: pulumi.Output[str],
        gateway: aws.ec2.InternetGateway,
        route_tables: list[pulumi.Output[str]],
        child: pulumi.ResourceOptions,
    ) -> pulumi.Output[str]:
        """A subnet whose nodes reach AWS's APIs through a NAT gateway in the public one."""
        address = aws.ec2.Eip(f"{name}-nat", domain="vpc", tags={"Name": f"{name}-nat"}, opts=child)
        nat = aws.ec2.NatGateway(
            f"{name}-nat",
            allocation_id=address.id,
            subnet_id=public_subnet_id,
            connectivity_type="public",
            tags={"Name": f"{name}-nat"},
            # A public NAT gateway needs the VPC's internet gateway attached first
            # (https://registry.terraform.io/providers/hashicorp/aws/latest/docs/resources/nat_gateway).
            opts=pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(depends_on=[gateway])),
        )
        subnet = aws.ec2.Subnet(
            f"{name}-private",
            vpc_id=vpc_id,
            cidr_block=PRIVATE_SUBNET_CIDR,
            availability_zone=self.availability_zone,
            map_public_ip_on_launch=False,
            tags={"Name": f"{name}-private"},
            opts=child,
        )
        routes = aws.ec2.RouteTable(
            f"{name}-private",
            vpc_id=vpc_id,
            routes=[{"cidr_block": "0.0.0.0/0", "nat_gateway_id": nat.id}],
            opts=child,
        )
        association = aws.ec2.RouteTableAssociation(
            f"{name}-private", subnet_id=subnet.id, route_table_id=routes.id, opts=child
        )
        route_tables.append(routes.id)
        self.route_out = [nat, routes, association]
        return subnet.id


def _offering_zones(instance_type: str, invoke: pulumi.InvokeOptions) -> list[str]:
    """The zones of the region that offer `instance_type` (EC2 DescribeInstanceTypeOfferings)."""
    return aws.ec2.get_instance_type_offerings(
        location_type="availability-zone",
        filters=[{"name": "instance-type", "values": [instance_type]}],
        opts=invoke,
    ).locations
