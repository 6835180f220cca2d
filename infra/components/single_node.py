"""The single-node stack (gpu:cluster unset): the foundation, then EC2 nodes that train on boot."""

from __future__ import annotations

import os

import pulumi

from common.market import Market
from infra.components.compute import Compute, ComputeArgs
from infra.components.default_job import default_job
from infra.components.iam import InstanceRole, InstanceRoleArgs
from infra.components.stack import STACK_TYPE, Foundation, StackArgs, foundation
from infra.config.schema import StackConfig
from infra.jobs import hf_token
from infra.knowledge.allreduce import node_expectation
from infra.knowledge.costs import hourly_usd, price_model
from infra.knowledge.resolver import Plan
from infra.node.boot import NodeBoot, render_user_data
from infra.outputs import SingleNodeOutputs
from infra.planning import train_config_text
from infra.project import WITHOUT_NODES_ENV


class SingleNodeStack(pulumi.ComponentResource):
    """Every resource of a stack of `plan.nodes` EC2 nodes, for one resolved plan."""

    outputs: SingleNodeOutputs

    def __init__(self, name: str, args: StackArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__(STACK_TYPE, name, None, opts)
        config, plan = args.config, args.plan
        base = foundation(self, name, args)
        storage = base.storage
        role = InstanceRole(
            name,
            InstanceRoleArgs(
                bucket_arn=storage.bucket_arn,
                repository_arn=storage.repository_arn,
                log_group_arn=storage.log_group_arn,
                data=config.data_s3_uri,
                alert_topic_arn=base.guardrails.alert_topic_arn,
            ),
            opts=base.child,
        )
        if config.train_config is not None:
            default_job(
                name,
                storage.bucket_name,
                train_config_text(config),
                hourly_usd(plan, config.market),
                opts=base.child,
            )
        # Without its nodes when `up` still has to push their image: nothing bills by the
        # hour before a job can start; the next `up` adds them.
        compute = None if os.environ.get(WITHOUT_NODES_ENV) else _nodes(name, args, base, role)
        instance_ids = compute.instance_ids if compute is not None else []
        if compute is not None:  # the budget's stop action and alarms, per instance
            base.guardrails.watch(instance_ids)
        self.outputs = SingleNodeOutputs(
            **base.shared_outputs(config, plan),
            market=config.market,
            price_model=price_model(
                plan,
                market=config.market,
                capacity_reservation_id=config.capacity_reservation_id,
                capacity_block_id=config.capacity_block_id,
            ),
            availability_zone=base.network.availability_zone,
            instance_ids=instance_ids,
            private_ips=compute.private_ips if compute is not None else [],
            ssm_sessions=[
                pulumi.Output.concat("aws ssm start-session --target ", instance_id)
                for instance_id in instance_ids
            ],
            log_group=storage.log_group_name,
            kept_on_destroy=base.kept_on_destroy(config),
            runway_hours=base.costs.runway_hours,
            cancel_spot_requests=(
                _cancel_spot_requests(base.region, compute)
                if config.market is Market.SPOT and compute is not None
                else None
            ),
        )
        self.register_outputs(self.outputs.present())


def _nodes(name: str, args: StackArgs, base: Foundation, role: InstanceRole) -> Compute:
    """The stack's EC2 nodes, booting into its training image."""
    config, plan = args.config, args.plan
    return Compute(
        name,
        ComputeArgs(
            instance_type=plan.instance.type,
            image_id=f"resolve:ssm:{plan.ami.ssm_parameter}",
            root_device_name=plan.ami.root_device_name,
            description=f"{plan.instance.type} x{plan.nodes}, {plan.ami.name}",
            market=config.market,
            root_volume_gib=config.root_volume_gib,
            availability_zone=base.network.availability_zone,
            subnet_id=base.network.subnet_id,
            security_group_id=base.network.security_group_id,
            instance_profile_arn=role.instance_profile_arn,
            user_data=_user_data(name, base, config, plan),
            wait_for=base.watchers,
            region=base.region,
            aws_profile=args.aws_settings.get("profile"),
            capacity_reservation_id=config.capacity_reservation_id or config.capacity_block_id,
            cost_tags=dict([base.tag]),
        ),
        opts=base.child,
    )


def _user_data(name: str, base: Foundation, config: StackConfig, plan: Plan) -> pulumi.Output[str]:
    """The boot script of every node, once the values only the deploy knows are known."""
    known_at_deploy = pulumi.Output.all(
        image_uri=base.image_uri,
        region=base.region,
        log_group=base.storage.log_group_name,
        checkpoint_s3_uri=base.storage.checkpoint_uri,
        alert_topic_arn=base.guardrails.alert_topic_arn,
    )
    return known_at_deploy.apply(
        lambda values: render_user_data(
            NodeBoot(
                **values,
                min_driver=plan.variant.min_driver,
                instance_store_drives=plan.instance.instance_store_nvme,
                data_s3_uri=str(config.data_s3_uri) if config.data_s3_uri else None,
                # One node attaches no EFA interface (compute.py).
                expectation=node_expectation(plan.instance, efa_attached=False),
                hf_token_secret=hf_token.secret_name(name),
            )
        )
    )


def _cancel_spot_requests(region: pulumi.Output[str], compute: Compute) -> pulumi.Output[str]:
    """A persistent spot request outlives its instance: cancel it before destroying the stack,
    or EC2 launches a replacement outside Pulumi (docs/stack.md)."""
    return pulumi.Output.all(region, *compute.spot_request_ids).apply(
        lambda values: (
            f"aws ec2 cancel-spot-instance-requests --region {values[0]} "
            f"--spot-instance-request-ids {' '.join(values[1:])}"
        )
    )
