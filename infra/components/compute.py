"""The GPU node: one launch template and the instance built from it.

The launch template carries the AMI (resolved by EC2 from the DLAMI family's
public SSM parameter at launch), the instance type, an encrypted gp3 root
volume, IMDSv2, the instance profile and the network interface. The node is an
aws.ec2.Instance built from it, so its instance ID is known to budgets and
alarms. More than one node is a Slurm cluster (infra/components/cluster.py).

Spot nodes use a persistent request that stops (not terminates) on interruption:
EC2 starts the same instance, with the same root volume, when capacity returns,
and the boot unit resumes the job. The market options sit on the instance, not
the template: a launch template's persistent request expires after 7 days unless
given an end date, a RunInstances one stays until cancelled.
"""

from __future__ import annotations

import pulumi
import pulumi_aws as aws

from infra.knowledge.resolver import Plan

# Throughput for the root volume: checkpoints are written there (gp3's baseline is 125 MiB/s).
ROOT_VOLUME_THROUGHPUT_MIBPS = 500
ROOT_VOLUME_IOPS = 3000


class Compute(pulumi.ComponentResource):
    """Launch template and node."""

    instance_ids: list[pulumi.Output[str]]
    private_ips: list[pulumi.Output[str]]
    spot_request_ids: list[pulumi.Output[str]]

    def __init__(
        self,
        name: str,
        *,
        plan: Plan,
        spot: bool,
        root_volume_gib: int,
        availability_zone: str,
        subnet_id: pulumi.Input[str],
        security_group_id: pulumi.Input[str],
        instance_profile_arn: pulumi.Input[str],
        user_data: pulumi.Input[str],
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        """`user_data` is the node's boot document (infra/node/boot.py)."""
        super().__init__("gpu:infra:Compute", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)

        template = aws.ec2.LaunchTemplate(
            f"{name}-node",
            description=f"{plan.instance.type} x{plan.nodes}, {plan.ami.name}",
            image_id=f"resolve:ssm:{plan.ami.ssm_parameter}",
            instance_type=plan.instance.type,
            iam_instance_profile={"arn": instance_profile_arn},
            metadata_options={
                "http_endpoint": "enabled",
                "http_tokens": "required",  # IMDSv2 only
                # 2 hops: containers on the docker bridge read spot notices from IMDS.
                "http_put_response_hop_limit": 2,
            },
            block_device_mappings=[
                {
                    # The AMI's own root device: under another name this would add a volume.
                    "device_name": plan.ami.root_device_name,
                    "ebs": {
                        "volume_size": root_volume_gib,
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
                    "subnet_id": subnet_id,
                    "security_groups": [security_group_id],
                    "delete_on_termination": "true",
                    "associate_public_ip_address": "true",
                }
            ],
            placement={"availability_zone": availability_zone},
            update_default_version=True,
            opts=child,
        )

        market = (
            {
                "market_type": "spot",
                "spot_options": {
                    "spot_instance_type": "persistent",
                    "instance_interruption_behavior": "stop",
                },
            }
            if spot
            else None
        )
        node = aws.ec2.Instance(
            f"{name}-node-0",
            launch_template={"id": template.id, "version": template.latest_version.apply(str)},
            instance_market_options=market,
            user_data=user_data,
            tags={"Name": f"{name}-node-0"},
            opts=child,
        )
        self.instance_ids = [node.id]
        self.private_ips = [node.private_ip]
        self.spot_request_ids = [node.spot_instance_request_id] if spot else []

        self.register_outputs(
            {
                "instance_ids": self.instance_ids,
                "private_ips": self.private_ips,
                "spot_request_ids": self.spot_request_ids,
            }
        )
