"""The stack's outputs: one typed definition the Pulumi program writes and the commands read.

The program fills a `StackOutputs` with Pulumi Outputs of the types below and exports one
output per field that is not None (`present`); the commands parse the values Pulumi
reports back (`pulumi stack output --json`, the Automation API's `outputs()`) with
`read_outputs`, and use attributes. Both stack kinds write every field but those whose
metadata names one `KIND`, which only that kind writes. Torch-free and Pulumi-free: the command line
imports it without either.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import field
from typing import Any, Literal

import pydantic

from common.market import Market
from infra.errors import ConfigError

SINGLE_NODE = "ec2"  # gpu:cluster unset: EC2 nodes (infra/components/single_node.py)
CLUSTER = (
    "slurm"  # gpu:cluster: slurm, a ParallelCluster cluster (infra/components/cluster_stack.py)
)
KIND = "kind"  # field metadata: the one stack kind that writes the field


_SINGLE_NODE_ONLY = {KIND: SINGLE_NODE}
_CLUSTER_ONLY = {KIND: CLUSTER}


@dataclasses.dataclass(frozen=True)
class StackOutputs:
    # Both stack kinds.
    instance_type: str
    nodes: int
    market: Market  # how the nodes are bought (gpu:spot, gpu:capacityBlockId...)
    cost_tag: str  # "key=value" on every instance: how the commands and the guard find them
    image_uri: str
    checkpoint_bucket: str
    checkpoint_uri: str  # s3://bucket/prefix the trainer mirrors its checkpoints under
    on_demand_usd_per_hour: float
    spot_usd_per_hour: float
    hourly_cost_usd: float  # every node running, in the stack's market
    monthly_budget_usd: float
    budget_name: str
    alert_topic_arn: str
    warnings: list[str]
    kept_on_destroy: list[str]  # what `pulumi destroy` leaves in the account (docs/costs.md)
    # The spend guard's DynamoDB ledger; None on a stack deployed before the guard existed.
    spend_ledger_table: str | None = None
    # The single-node stack only.
    price_model: str | None = field(default=None, metadata=_SINGLE_NODE_ONLY)
    availability_zone: str | None = field(default=None, metadata=_SINGLE_NODE_ONLY)
    instance_ids: list[str] | None = field(
        default=None, metadata=_SINGLE_NODE_ONLY
    )  # in rank order
    private_ips: list[str] | None = field(default=None, metadata=_SINGLE_NODE_ONLY)
    ssm_sessions: list[str] | None = field(default=None, metadata=_SINGLE_NODE_ONLY)
    log_group: str | None = field(default=None, metadata=_SINGLE_NODE_ONLY)
    runway_hours: float | None = field(
        default=None, metadata=_SINGLE_NODE_ONLY
    )  # hours of full load the budget buys
    # Only on a spot stack: a persistent spot request outlives its instance (docs/stack.md).
    cancel_spot_requests: str | None = field(default=None, metadata=_SINGLE_NODE_ONLY)
    # The cluster stack only.
    cluster: Literal["slurm"] | None = field(default=None, metadata=_CLUSTER_ONLY)
    cluster_name: str | None = field(
        default=None, metadata=_CLUSTER_ONLY
    )  # ParallelCluster's name for the cluster
    parallelcluster_version: str | None = field(default=None, metadata=_CLUSTER_ONLY)
    queue: str | None = field(default=None, metadata=_CLUSTER_ONLY)
    head_node: str | None = field(default=None, metadata=_CLUSTER_ONLY)
    head_node_ip: str | None = field(default=None, metadata=_CLUSTER_ONLY)
    submit_command: str | None = field(default=None, metadata=_CLUSTER_ONLY)
    idle_usd_per_hour: float | None = field(
        default=None, metadata=_CLUSTER_ONLY
    )  # the head node and NAT gateway, no job
    cluster_log_group_prefix: str | None = field(default=None, metadata=_CLUSTER_ONLY)

    @property
    def kind(self) -> str:
        """SINGLE_NODE or CLUSTER: which target (infra/targets/) the commands open."""
        return self.cluster or SINGLE_NODE

    def present(self) -> dict[str, Any]:
        """The fields this stack writes (not None), by output name: what the program exports."""
        return {
            field.name: getattr(self, field.name)
            for field in dataclasses.fields(self)
            if getattr(self, field.name) is not None
        }


def written_by(kind: str) -> set[str]:
    """The outputs a stack of `kind` writes (a spot stack adds cancel_spot_requests)."""
    return {
        field.name
        for field in dataclasses.fields(StackOutputs)
        if field.metadata.get(KIND, kind) == kind
    }


_PARSER = pydantic.TypeAdapter(StackOutputs)


def read_outputs(stack: str, values: Mapping[str, Any]) -> StackOutputs:
    """Stack `stack`'s outputs as Pulumi reports them (name -> plain value), checked.

    Outputs a newer program no longer writes are ignored; one this definition needs and the
    stack lacks (a stack from an older program) is a ConfigError that says how to add it.
    """
    names = {field.name for field in dataclasses.fields(StackOutputs)}
    try:
        return _PARSER.validate_python({k: v for k, v in values.items() if k in names})
    except pydantic.ValidationError as error:
        problem = error.errors()[0]
        name = ".".join(str(part) for part in problem["loc"])
        what = "has no output" if problem["type"] == "missing" else "has a malformed output"
        raise ConfigError(
            f"stack {stack} {what} {name!r} ({problem['msg']}): `python -m infra up {stack}` "
            "writes it (no resource changes)"
        ) from None
