"""The GPU node: one launch template, one instance (more nodes run on the Slurm cluster).

The launch template carries what every node shares: the AMI (resolved by EC2
from the DLAMI family's public SSM parameter at launch), the instance type, an
encrypted gp3 root volume, IMDSv2, the instance profile and the network
interface. The node is an aws.ec2.Instance built from it, so its instance ID is
known to budgets and alarms, with its own user data.

Spot nodes use a persistent request that stops (not terminates) on interruption:
EC2 starts the same instance, with the same root volume, when capacity returns,
and the boot unit resumes the job. The market options sit on the instance, not
the template: a launch template's persistent request expires after 7 days unless
given an end date, a RunInstances one stays until cancelled.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pulumi
import pulumi_aws as aws

from common.market import Market
from infra.components.spot_request import SpotRequestCanceller

# Throughput for the root volume: checkpoints are written there (gp3's baseline is 125 MiB/s).
ROOT_VOLUME_THROUGHPUT_MIBPS = 500
ROOT_VOLUME_IOPS = 3000


@dataclass(frozen=True)
class ComputeArgs:
    instance_type: str
    image_id: str  # an AMI id, or "resolve:ssm:<public parameter>" that EC2 resolves at launch
    root_device_name: str  # the AMI's own root device: under another name it would add a volume
    description: str
    market: Market  # the stack's; EC2's market options are built from it here
    root_volume_gib: int
    availability_zone: pulumi.Input[str]
    subnet_id: pulumi.Input[str]
    security_group_id: pulumi.Input[str]
    instance_profile_arn: pulumi.Input[str]
    user_data: pulumi.Input[str]  # the node's boot document (infra.node.boot)
    # What every node waits for: the guardrails (budget, alert topic), so no node runs unwatched.
    wait_for: Sequence[pulumi.Resource] = ()
    # The capacity reservation to launch into: an On-Demand Capacity Reservation
    # (Market.RESERVATION) or the reservation of an EC2 Capacity Block (Market.CAPACITY_BLOCK).
    capacity_reservation_id: str | None = None
    # The stack's cost-allocation tag(s), for what the launch template creates.
    cost_tags: Mapping[str, str] = field(default_factory=dict)
    # Where and as whom the spot-request canceller calls EC2 (the stack's aws: settings).
    region: pulumi.Input[str] | None = None
    aws_profile: str | None = None


class Compute(pulumi.ComponentResource):
    """Launch template and the node."""

    instance_ids: list[pulumi.Output[str]]
    private_ips: list[pulumi.Output[str]]
    spot_request_ids: list[pulumi.Output[str]]

    def __init__(
        self,
        name: str,
        args: ComputeArgs,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("gpu:infra:Compute", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        template = _launch_template(f"{name}-node", args, child)
        market, reservation = _market_options(args)
        self.instance_ids, self.private_ips, self.spot_request_ids = [], [], []
        # "-node-0" and rank 0, as when stacks could have more nodes: an existing stack
        # keeps its instance. Lists, as the command line reads them (instance_ids...).
        node_name = f"{name}-node-0"
        node = aws.ec2.Instance(
            node_name,
            launch_template={"id": template.id, "version": template.latest_version.apply(str)},
            instance_market_options=market,
            capacity_reservation_specification=reservation,
            user_data=args.user_data,
            # Changed user data would only stop and start the instance, and cloud-init
            # writes its files once per instance: the node would keep its first boot's
            # scripts and job (pulumi-aws Instance, user_data: "Updates to this field will
            # trigger a stop/start"). Replace the node instead.
            user_data_replace_on_change=True,
            tags={"Name": node_name, "gpu-node-rank": "0"},
            opts=pulumi.ResourceOptions(
                parent=self,
                depends_on=list(args.wait_for),
                # A replacement (new user data or launch template version, which is
                # ForceNew) deletes the old node first: two p4d.24xlarge at once would need
                # twice the vCPU quota (VcpuLimitExceeded) or double the bill.
                delete_before_replace=True,
            ),
        )
        self.instance_ids.append(node.id)
        self.private_ips.append(node.private_ip)
        if args.market is Market.SPOT:
            self.spot_request_ids.append(node.spot_instance_request_id)
            # Deleted before its node (it depends on it), on destroy and on replacement.
            SpotRequestCanceller(
                f"{node_name}-spot-request",
                spot_request_id=node.spot_instance_request_id,
                instance_id=node.id,
                region=args.region,
                profile=args.aws_profile,
                opts=pulumi.ResourceOptions(parent=self, delete_before_replace=True),
            )

        self.register_outputs(
            {
                "instance_ids": self.instance_ids,
                "private_ips": self.private_ips,
                "spot_request_ids": self.spot_request_ids,
            }
        )


def _launch_template(
    name: str, args: ComputeArgs, opts: pulumi.ResourceOptions
) -> aws.ec2.LaunchTemplate:
    """The node's template: IMDSv2, an encrypted gp3 root volume, one public ENA interface."""
    return aws.ec2.LaunchTemplate(
        name,
        description=args.description,
        image_id=args.image_id,
        instance_type=args.instance_type,
        iam_instance_profile={"arn": args.instance_profile_arn},
        metadata_options={
            "http_endpoint": "enabled",
            "http_tokens": "required",  # IMDSv2 only
            # 2 hops: containers on the docker bridge read spot notices from IMDS.
            "http_put_response_hop_limit": 2,
        },
        block_device_mappings=[
            {
                "device_name": args.root_device_name,
                "ebs": {
                    "volume_size": args.root_volume_gib,
                    "volume_type": "gp3",
                    "iops": ROOT_VOLUME_IOPS,
                    "throughput": ROOT_VOLUME_THROUGHPUT_MIBPS,
                    "encrypted": "true",
                    "delete_on_termination": "true",
                },
            }
        ],
        network_interfaces=[
            {
                "network_card_index": 0,
                "device_index": 0,
                "interface_type": None,  # a plain ENA interface
                "subnet_id": args.subnet_id,
                "security_groups": [args.security_group_id],
                "delete_on_termination": "true",
                "associate_public_ip_address": "true",
            }
        ],
        placement={"availability_zone": args.availability_zone},
        # Provider default tags reach the instance but not what it creates: volumes,
        # interfaces and spot requests would escape the cost tag a budget filters on
        # (hashicorp/terraform-provider-aws issue 19890; EC2 User Guide, "Tag your
        # resources": tag on creation through the launch template's TagSpecifications).
        tag_specifications=[
            {"resource_type": kind, "tags": dict(args.cost_tags)}
            for kind in ("instance", "volume", "network-interface", "spot-instances-request")
        ],
        update_default_version=True,
        opts=opts,
    )


def _market_options(args: ComputeArgs) -> tuple[dict | None, dict | None]:
    """The instance's market (spot, Capacity Block or on-demand) and capacity reservation."""
    market = None
    if args.market is Market.SPOT:
        market = {
            "market_type": "spot",
            "spot_options": {
                "spot_instance_type": "persistent",
                "instance_interruption_behavior": "stop",
            },
        }
    elif args.market is Market.CAPACITY_BLOCK:
        # A Capacity Block is launched into with market type "capacity-block" and its
        # reservation as the target (EC2 User Guide, "Launch instances into a Capacity
        # Block", https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/capacity-blocks-launch.html).
        market = {"market_type": "capacity-block"}
    # An On-Demand Capacity Reservation is targeted by id (EC2 User Guide, "Launch
    # instances into an existing Capacity Reservation",
    # https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/capacity-reservations-launch.html).
    reservation = (
        {"capacity_reservation_target": {"capacity_reservation_id": args.capacity_reservation_id}}
        if args.capacity_reservation_id is not None
        else None
    )
    return market, reservation
