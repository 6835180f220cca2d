"""The foundation both kinds of training stack stand on: provider, network, storage, guardrails.

`foundation(stack, name, args)` builds, as children of the stack's
component (SingleNodeStack or ClusterStack), through its own AWS provider whose default tags
put the stack's cost-allocation tag on everything that takes tags (budgets filter on that
tag): the network, storage, the budget and alarms and the spend guard. Each kind then adds
its nodes and writes its kind's outputs (infra/outputs.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_aws as aws

from infra.components.guardrails import Guardrails, GuardrailsArgs
from infra.components.network import Network, NetworkArgs
from infra.components.spend_guard import SpendGuard, SpendGuardArgs
from infra.components.storage import Storage, StorageArgs
from infra.config.schema import StackConfig
from infra.knowledge.costs import CostSummary, cost_summary
from infra.knowledge.parallelcluster import HeadNode
from infra.knowledge.resolver import Plan

COST_TAG_KEY = "gpu-stack"
# Both kinds' component type: every resource's URN starts with it, so an existing stack of
# either kind keeps its URNs.
STACK_TYPE = "gpu:infra:TrainingStack"


def cost_tag() -> tuple[str, str]:
    """(key, value) of the tag every resource carries: `gpu-stack: <project>-<stack>`."""
    return COST_TAG_KEY, f"{pulumi.get_project()}-{pulumi.get_stack()}"


@dataclass(frozen=True)
class StackArgs:
    """What either kind of stack is built from."""

    config: StackConfig
    plan: Plan
    # The stack file's aws: settings (profile, region, assumeRoles...) as provider arguments
    # (infra/components/stack_config.py): an explicit provider reads none of them by itself.
    aws_settings: dict[str, Any]


@dataclass(frozen=True)
class Foundation:
    child: pulumi.ResourceOptions  # parent: the stack; AWS resources through its provider
    network: Network
    storage: Storage
    guardrails: Guardrails
    spend_guard: SpendGuard
    region: pulumi.Output[str]
    image_uri: pulumi.Output[str]
    costs: CostSummary  # in the stack's market
    tag: tuple[str, str]

    @property
    def watchers(self) -> list[pulumi.Resource]:
        """What exists before any node runs: the budget, its alerts and the spend guard."""
        return [*self.guardrails.ready, self.spend_guard]

    def kept_on_destroy(self, config: StackConfig, *more: pulumi.Input[str]) -> list:
        """What `pulumi destroy` leaves in the account (docs/costs.md)."""
        if config.delete_data_on_destroy:
            return []
        return [
            pulumi.Output.concat("s3://", self.storage.bucket_name),
            self.storage.repository_url,
            *more,
        ]

    def shared_outputs(self, config: StackConfig, plan: Plan) -> dict[str, Any]:
        """The outputs every kind writes (infra/outputs.py), the same way."""
        return {
            "instance_type": plan.instance.type,
            "nodes": plan.nodes,
            "cost_tag": "=".join(self.tag),
            "image_uri": self.image_uri,
            "checkpoint_bucket": self.storage.bucket_name,
            "checkpoint_uri": self.storage.checkpoint_uri,
            "on_demand_usd_per_hour": self.costs.on_demand_usd_per_hour,
            "spot_usd_per_hour": self.costs.spot_usd_per_hour,
            "hourly_cost_usd": self.costs.hourly_usd,
            "monthly_budget_usd": self.costs.monthly_budget_usd,
            "budget_name": self.guardrails.budget_name,
            "alert_topic_arn": self.guardrails.alert_topic_arn,
            "spend_ledger_table": self.spend_guard.ledger_table_name,
            "warnings": [*plan.warnings, *config.guardrails.warnings],
        }


def foundation(
    stack: pulumi.ComponentResource, name: str, args: StackArgs, head_node: HeadNode | None = None
) -> Foundation:
    """The shared resources of stack `name`, as children of `stack`. `head_node`: a cluster's,
    whose price the spend guard counts."""
    config, plan = args.config, args.plan
    tag = cost_tag()
    provider = aws.Provider(
        f"{name}-aws",
        **args.aws_settings,
        default_tags={"tags": dict([tag])},
        opts=pulumi.ResourceOptions(parent=stack),
    )
    child = pulumi.ResourceOptions(parent=stack, providers={"aws": provider})
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
    guardrails = Guardrails(name, GuardrailsArgs(config.guardrails, tag), opts=child)
    # Finds the instances by their tag (on a cluster, ParallelCluster's Tags put it on the
    # head node and every node Slurm starts), so it counts them from their launch whenever
    # it starts; it needs the guardrails' alert topic. The nodes wait for it too.
    spend_guard = SpendGuard(
        name,
        SpendGuardArgs(
            plan=plan,
            guardrails=config.guardrails,
            cost_tag=tag,
            alert_topic_arn=guardrails.alert_topic_arn,
            head_node=head_node,
            # ClusterStack names its ParallelCluster cluster after the stack.
            cluster_name=name if config.cluster is not None else "",
            capacity_block_id=config.capacity_block_id or "",
        ),
        opts=child,
    )
    image_tag = config.image_tag or plan.image_tag
    # name:tag@digest: Docker and Enroot (4.0+, src/docker.sh _parse_uri) pull the digest; the
    # tag stays for people reading it.
    pinned = f"@{config.image_digest}" if config.image_digest else ""
    region = aws.get_region_output(opts=pulumi.InvokeOutputOptions(parent=stack, provider=provider))
    return Foundation(
        child=child,
        network=network,
        storage=storage,
        guardrails=guardrails,
        spend_guard=spend_guard,
        region=region.region,
        image_uri=storage.repository_url.apply(lambda url: f"{url}:{image_tag}{pinned}"),
        # What the stack costs (infra.knowledge.costs): $/h of all nodes in each market and
        # in the one it uses, and the budget per month.
        costs=cost_summary(plan, config.guardrails, market=config.market),
        tag=tag,
    )
