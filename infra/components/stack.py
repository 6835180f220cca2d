"""The whole training stack as one component: network, storage, access, nodes, guardrails.

`TrainingStack(name, config, plan)` builds every resource as a child, through
its own AWS provider whose default tags put the stack's cost-allocation tag on
everything that takes tags (budgets filter on that tag).
"""

from __future__ import annotations

import pulumi
import pulumi_aws as aws

from infra.components.cluster import ClusterArgs, SlurmCluster
from infra.components.compute import Compute, ComputeArgs
from infra.components.default_job import default_job
from infra.components.guardrails import Guardrails, GuardrailsArgs
from infra.components.iam import InstanceRole, InstanceRoleArgs
from infra.components.network import VPC_CIDR, Network, NetworkArgs
from infra.components.spend_guard import SpendGuard, SpendGuardArgs
from infra.components.stack_config import namespace_config, provider_settings
from infra.components.storage import Storage, StorageArgs
from infra.config.schema import StackConfig
from infra.knowledge.allreduce import node_expectation
from infra.knowledge.costs import cost_summary, hourly_usd, price_model
from infra.knowledge.parallelcluster import ParallelCluster, load_parallelcluster
from infra.knowledge.resolver import Plan
from infra.node.boot import NodeBoot, render_user_data

COST_TAG_KEY = "gpu-stack"


def cost_tag() -> tuple[str, str]:
    """(key, value) of the tag every resource carries: `gpu-stack: <project>-<stack>`."""
    return COST_TAG_KEY, f"{pulumi.get_project()}-{pulumi.get_stack()}"


class TrainingStack(pulumi.ComponentResource):
    """Every resource of one training stack, for one resolved plan."""

    def __init__(
        self,
        name: str,
        config: StackConfig,
        plan: Plan,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("gpu:infra:TrainingStack", name, None, opts)
        tag_key, tag_value = cost_tag()
        # The stack file's aws: settings (profile, region, assumeRoles...): an explicit
        # provider reads none of them by itself.
        aws_settings = provider_settings(namespace_config("aws"))
        provider = aws.Provider(
            f"{name}-aws",
            **aws_settings,
            default_tags={"tags": {tag_key: tag_value}},
            opts=pulumi.ResourceOptions(parent=self),
        )
        child = pulumi.ResourceOptions(parent=self, providers={"aws": provider})

        network = Network(
            name,
            NetworkArgs(
                instance_type=plan.instance.type,
                availability_zone=config.availability_zone,
                use_default_vpc=config.use_default_vpc,
                ssh_cidr=config.ssh_cidr,
                # The cluster's nodes hold no public address: a NAT gateway is their way out.
                private_subnet=config.cluster is not None,
            ),
            opts=child,
        )
        storage = Storage(
            name,
            StorageArgs(
                log_retention_days=config.log_retention_days,
                delete_data_on_destroy=config.delete_data_on_destroy,
            ),
            opts=child,
        )
        # The budget, its alert topic and subscriptions exist before any node starts.
        guardrails = Guardrails(
            name, GuardrailsArgs.from_settings(config.guardrails, (tag_key, tag_value)), opts=child
        )
        parallelcluster = load_parallelcluster() if config.cluster is not None else None
        head_node = parallelcluster.head_node if parallelcluster is not None else None
        # Finds the instances by their tag (on a cluster, ParallelCluster's Tags put it on the
        # head node and every node Slurm starts), so it counts them from their launch whenever
        # it starts; it needs the guardrails' alert topic. The nodes wait for it too.
        spend_guard = SpendGuard(
            name,
            SpendGuardArgs(
                plan=plan,
                guardrails=config.guardrails,
                cost_tag=(tag_key, tag_value),
                alert_topic_arn=guardrails.alert_topic_arn,
                head_node=head_node,
                # SlurmCluster names its ParallelCluster cluster after the stack.
                cluster_name=name if config.cluster is not None else "",
                capacity_block_id=config.capacity_block_id or "",
            ),
            opts=child,
        )
        image_tag = config.image_tag or plan.image_tag
        self.image_uri = storage.repository_url.apply(lambda url: f"{url}:{image_tag}")
        region = aws.get_region_output(
            opts=pulumi.InvokeOutputOptions(parent=self, provider=provider)
        )
        # What the stack costs (infra.knowledge.costs): $/h of all nodes in each market and
        # in the one it uses, and the budget per month.
        costs = cost_summary(plan, config.guardrails, market=config.market)
        # The outputs of both kinds of stack, which the commands read (docs/contracts.md).
        shared_outputs = {
            "instance_type": plan.instance.type,
            "nodes": plan.nodes,
            # How the commands and the spend guard find the stack's instances.
            "cost_tag": f"{tag_key}={tag_value}",
            "image_uri": self.image_uri,
            "checkpoint_bucket": storage.bucket_name,
            "checkpoint_uri": storage.checkpoint_uri,
            "on_demand_usd_per_hour": costs["on_demand_usd_per_hour"],
            "spot_usd_per_hour": costs["spot_usd_per_hour"],
            "hourly_cost_usd": costs["hourly_usd"],  # every node running
            "monthly_budget_usd": costs["monthly_budget_usd"],
            "budget_name": guardrails.budget_name,
            "alert_topic_arn": guardrails.alert_topic_arn,
            "spend_ledger_table": spend_guard.ledger_table_name,
            "warnings": [*plan.warnings, *config.guardrails.warnings],
        }
        if parallelcluster is not None:
            self._slurm_cluster(
                name,
                config=config,
                plan=plan,
                parallelcluster=parallelcluster,
                subnet_id=network.subnet_id,
                storage=storage,
                watched_by=[*guardrails.ready, spend_guard],
                region=region.region,
                shared_outputs=shared_outputs,
                child=child,
            )
            return
        role = InstanceRole(
            name,
            InstanceRoleArgs(
                bucket_arn=storage.bucket_arn,
                repository_arn=storage.repository_arn,
                log_group_arn=storage.log_group_arn,
                data=config.data_s3_uri,
                alert_topic_arn=guardrails.alert_topic_arn,
            ),
            opts=child,
        )
        known_at_deploy = pulumi.Output.all(
            image_uri=self.image_uri,
            region=region.region,
            log_group=storage.log_group_name,
            checkpoint_s3_uri=storage.checkpoint_uri,
            alert_topic_arn=guardrails.alert_topic_arn,
        )
        user_data = known_at_deploy.apply(
            lambda values: render_user_data(
                NodeBoot(
                    **values,
                    min_driver=plan.variant.min_driver,
                    instance_store_drives=plan.instance.instance_store_nvme,
                    data_s3_uri=str(config.data_s3_uri) if config.data_s3_uri else None,
                    # One node attaches no EFA interface (compute.py).
                    expectation=node_expectation(plan.instance, efa_attached=False),
                )
            )
        )

        if config.train_config is not None:
            default_job(
                name,
                storage.bucket_name,
                config.train_config_text,
                hourly_usd(plan, config.market),
                opts=child,
            )
        compute = Compute(
            name,
            ComputeArgs(
                instance_type=plan.instance.type,
                image_id=f"resolve:ssm:{plan.ami.ssm_parameter}",
                root_device_name=plan.ami.root_device_name,
                description=f"{plan.instance.type} x{plan.nodes}, {plan.ami.name}",
                spot=config.spot,
                root_volume_gib=config.root_volume_gib,
                availability_zone=network.availability_zone,
                subnet_id=network.subnet_id,
                security_group_id=network.security_group_id,
                instance_profile_arn=role.instance_profile_arn,
                user_data=user_data,
                wait_for=[*guardrails.ready, spend_guard],
                region=region.region,
                aws_profile=aws_settings.get("profile"),
                capacity_reservation_id=config.capacity_reservation_id or config.capacity_block_id,
                capacity_block=config.capacity_block_id is not None,
                cost_tags={tag_key: tag_value},
            ),
            opts=child,
        )
        guardrails.watch(compute.instance_ids)

        self.outputs = {
            **shared_outputs,
            "market": config.market,
            "price_model": price_model(
                plan,
                spot=config.spot,
                capacity_reservation_id=config.capacity_reservation_id,
                capacity_block_id=config.capacity_block_id,
            ),
            "availability_zone": network.availability_zone,
            "instance_ids": compute.instance_ids,
            "private_ips": compute.private_ips,
            "ssm_sessions": [
                pulumi.Output.concat("aws ssm start-session --target ", instance_id)
                for instance_id in compute.instance_ids
            ],
            "log_group": storage.log_group_name,
            # What `pulumi destroy` leaves in the account (docs/costs.md).
            "kept_on_destroy": (
                []
                if config.delete_data_on_destroy
                else [
                    pulumi.Output.concat("s3://", storage.bucket_name),
                    storage.repository_url,
                ]
            ),
            # The hours of full load the budget buys.
            "runway_hours": costs["runway_hours"],
        }
        if config.spot:
            # A persistent spot request outlives its instance: cancel it before destroying
            # the stack, or EC2 launches a replacement outside Pulumi (docs/stack.md).
            self.outputs["cancel_spot_requests"] = pulumi.Output.all(
                region.region, *compute.spot_request_ids
            ).apply(
                lambda values: (
                    f"aws ec2 cancel-spot-instance-requests --region {values[0]} "
                    f"--spot-instance-request-ids {' '.join(values[1:])}"
                )
            )
        self.register_outputs(self.outputs)

    def _slurm_cluster(
        self,
        name: str,
        *,
        config: StackConfig,
        plan: Plan,
        parallelcluster: ParallelCluster,
        subnet_id: pulumi.Output[str],
        storage: Storage,
        watched_by: list[pulumi.Resource],
        region: pulumi.Output[str],
        shared_outputs: dict,
        child: pulumi.ResourceOptions,
    ) -> None:
        """gpu:cluster: slurm: a ParallelCluster cluster instead of the EC2 nodes."""
        tag_key, tag_value = cost_tag()
        # Checked with the plan (StackConfig.resolve_plan), before the first resource.
        idle_usd_per_hour = parallelcluster.idle_usd_per_hour(plan.price.region)
        cluster = SlurmCluster(
            name,
            ClusterArgs(
                plan=plan,
                head_node=parallelcluster.head_node,
                subnet_id=subnet_id,
                bucket_name=storage.bucket_name,
                bucket_arn=storage.bucket_arn,
                checkpoint_uri=storage.checkpoint_uri,
                repository_arn=storage.repository_arn,
                image_uri=self.image_uri,
                log_group_arn=storage.log_group_arn,
                region=region,
                # ParallelCluster tags what it creates (the nodes too) with these.
                tags={tag_key: tag_value},
                spot=config.spot,
                # The head node sits in the stack's private subnet: SSH, if any, from
                # gpu:sshCidr (over a VPN or peering), else from inside the VPC only.
                ssh_allowed_cidr=str(config.ssh_cidr) if config.ssh_cidr else VPC_CIDR,
                capacity_block_id=config.capacity_block_id,
                data=config.data_s3_uri,
                log_retention_days=config.log_retention_days,
                delete_data_on_destroy=config.delete_data_on_destroy,
            ),
            # No node runs unwatched: the budget, its alerts and the guard come first.
            opts=pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(depends_on=watched_by)),
        )
        self.outputs = {
            **shared_outputs,
            "cluster": "slurm",
            # ParallelCluster's name for it, as SlurmCluster and the spend guard use it.
            "cluster_name": name,
            "parallelcluster_version": plan.cluster.version,
            "market": cluster.market,
            "queue": cluster.queue,
            "head_node": cluster.head_node_id,
            "head_node_ip": cluster.head_node_ip,
            "submit_command": cluster.submit_command,
            # With no job the queue has no nodes: the head node and its NAT gateway are all
            # the cluster costs.
            "idle_usd_per_hour": idle_usd_per_hour,
            "cluster_log_group_prefix": cluster.log_group_prefix,
            # What `pulumi destroy` leaves in the account (docs/costs.md).
            "kept_on_destroy": (
                []
                if config.delete_data_on_destroy
                else [
                    pulumi.Output.concat("s3://", storage.bucket_name),
                    storage.repository_url,
                    f"{cluster.log_group_prefix}*",
                ]
            ),
        }
        self.register_outputs(self.outputs)
