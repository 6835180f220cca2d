"""The cluster stack (gpu:cluster: slurm): the foundation, then a ParallelCluster cluster."""

from __future__ import annotations

import pulumi

from infra.cluster.config import check_cluster_name
from infra.components.cluster import ClusterArgs, SlurmCluster
from infra.components.network import VPC_CIDR
from infra.components.stack import STACK_TYPE, StackArgs, foundation
from infra.knowledge.parallelcluster import load_parallelcluster
from infra.outputs import ClusterOutputs


class ClusterStack(pulumi.ComponentResource):
    """Every resource of a Slurm cluster stack, for one plan resolved with a ParallelCluster
    release (plan.cluster)."""

    outputs: ClusterOutputs

    def __init__(self, name: str, args: StackArgs, opts: pulumi.ResourceOptions | None = None):
        # ParallelCluster names the cluster after the stack (SlurmCluster): refused here, not
        # minutes into the create.
        check_cluster_name(name, pulumi.get_stack())
        super().__init__(STACK_TYPE, name, None, opts)
        config, plan = args.config, args.plan
        parallelcluster = load_parallelcluster()
        base = foundation(self, name, args, parallelcluster.head_node)
        cluster = SlurmCluster(
            name,
            ClusterArgs(
                plan=plan,
                head_node=parallelcluster.head_node,
                subnet_id=base.network.subnet_id,
                route_out=base.network.route_out,
                storage=base.storage,
                image_uri=base.image_uri,
                region=base.region,
                # ParallelCluster tags what it creates (the nodes too) with these.
                tags=dict([base.tag]),
                market=config.market,
                # The head node sits in the stack's private subnet: SSH, if any, from
                # gpu:sshCidr (over a VPN or peering), else from inside the VPC only.
                ssh_allowed_cidr=str(config.ssh_cidr) if config.ssh_cidr else VPC_CIDR,
                capacity_block_id=config.capacity_block_id,
                data=config.data_s3_uri,
                log_retention_days=config.log_retention_days,
                delete_data_on_destroy=config.delete_data_on_destroy,
            ),
            # No node runs unwatched: the budget, its alerts and the guard come first.
            opts=pulumi.ResourceOptions.merge(
                base.child, pulumi.ResourceOptions(depends_on=base.watchers)
            ),
        )
        self.outputs = ClusterOutputs(
            **base.shared_outputs(config, plan),
            # ParallelCluster's name for it, as SlurmCluster and the spend guard use it.
            cluster_name=name,
            parallelcluster_version=plan.cluster.version,
            market=cluster.market,
            queue=cluster.queue,
            head_node=cluster.head_node_id,
            head_node_ip=cluster.head_node_ip,
            submit_command=cluster.submit_command,
            # With no job the queue has no nodes: the head node and its NAT gateway are all
            # the cluster costs. Checked with the plan (infra.planning.resolve_plan).
            idle_usd_per_hour=parallelcluster.idle_usd_per_hour(plan.price.region),
            cluster_log_group_prefix=cluster.log_group_prefix,
            kept_on_destroy=base.kept_on_destroy(config, f"{cluster.log_group_prefix}*"),
        )
        self.register_outputs(self.outputs.present())
