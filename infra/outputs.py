"""The stack's outputs: one typed definition the Pulumi program writes and the commands read.

Each kind of stack has its own record (`SingleNodeOutputs`, `ClusterOutputs`), holding
what every kind writes and its own fields; `kind` tells them apart. The program fills its
kind's record with Pulumi Outputs of the types below and exports one output per field that
is not None (`present`); the commands parse the values Pulumi reports back (`pulumi stack
output --json`, the Automation API's `outputs()`) with `read_outputs` into the union
`StackOutputs`, and open the target of its kind (infra/targets/). Torch-free and
Pulumi-free: the command line imports it without either.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Annotated, Any, Literal

import pydantic

from common.market import Market
from infra.errors import ConfigError

SINGLE_NODE = "ec2"  # gpu:cluster unset: EC2 nodes (infra/components/single_node.py)
CLUSTER = "slurm"  # gpu:cluster: slurm, a ParallelCluster cluster (cluster_stack.py)
# The local stack: this machine, outside Pulumi (infra/targets/local.py). Its kind is also
# its stack name, which no stack file may take.
LOCAL = "local"


@dataclasses.dataclass(frozen=True, kw_only=True)
class _SharedOutputs:
    """What every kind of stack writes."""

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

    def present(self) -> dict[str, Any]:
        """The fields this stack writes (not None), by output name: what the program exports."""
        return {
            field.name: getattr(self, field.name)
            for field in dataclasses.fields(self)
            if getattr(self, field.name) is not None
        }


@dataclasses.dataclass(frozen=True, kw_only=True)
class SingleNodeOutputs(_SharedOutputs):
    """The single-node stack's: EC2 instances that read the job spool."""

    kind: Literal["ec2"] = SINGLE_NODE
    price_model: str
    availability_zone: str
    instance_ids: list[str]  # in rank order
    private_ips: list[str]
    ssm_sessions: list[str]
    log_group: str
    runway_hours: float  # hours of full load the budget buys
    # Only on a spot stack: a persistent spot request outlives its instance (docs/stack.md).
    cancel_spot_requests: str | None = None

    @property
    def has_compute(self) -> bool:
        return bool(self.instance_ids)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ClusterOutputs(_SharedOutputs):
    """The cluster stack's: a ParallelCluster Slurm cluster, reached through its head node."""

    kind: Literal["slurm"] = CLUSTER
    cluster_name: str  # ParallelCluster's name for the cluster
    parallelcluster_version: str
    queue: str
    head_node: str
    head_node_ip: str
    submit_command: str
    idle_usd_per_hour: float  # the head node and NAT gateway, no job
    cluster_log_group_prefix: str

    @property
    def has_compute(self) -> bool:
        return bool(self.head_node)


@dataclasses.dataclass(frozen=True, kw_only=True)
class LocalOutputs:
    """The local stack's: not written by Pulumi, made by its target from this machine."""

    kind: Literal["local"] = LOCAL
    instance_type: str  # this machine, in words: "this machine (2 CPU cores, no GPU)"
    nodes: int = 1
    hourly_cost_usd: float = 0.0  # nothing is rented
    checkpoint_uri: str  # the folder holding each job's checkpoints and output

    @property
    def has_compute(self) -> bool:
        return True


# The union the commands read, told apart by `kind` (which target infra/targets/ opens).
StackOutputs = SingleNodeOutputs | ClusterOutputs | LocalOutputs
KINDS: dict[str, type[StackOutputs]] = {SINGLE_NODE: SingleNodeOutputs, CLUSTER: ClusterOutputs}


def written_by(kind: str) -> set[str]:
    """The outputs a stack of `kind` writes (a spot stack adds cancel_spot_requests)."""
    return {field.name for field in dataclasses.fields(KINDS[kind])}


# What Pulumi reports back: the kinds a Pulumi program writes.
_PARSER = pydantic.TypeAdapter(
    Annotated[SingleNodeOutputs | ClusterOutputs, pydantic.Field(discriminator="kind")]
)
_NAMES = set().union(*(written_by(kind) for kind in KINDS))


def read_outputs(stack: str, values: Mapping[str, Any]) -> StackOutputs:
    """Stack `stack`'s outputs as Pulumi reports them (name -> plain value), checked.

    Outputs a newer program no longer writes are ignored; one this definition needs and the
    stack lacks (a stack from an older program) is a ConfigError that says how to add it.
    """
    try:
        return _PARSER.validate_python({k: v for k, v in values.items() if k in _NAMES})
    except pydantic.ValidationError as error:
        problem = error.errors()[0]
        # A kind's own fields are reported under the kind's name: ("ec2", "log_group").
        parts = [str(part) for part in problem["loc"]]
        name = ".".join(parts[1:] if parts[:1] and parts[0] in KINDS else parts) or "kind"
        missing = problem["type"] in ("missing", "union_tag_not_found")
        what = "has no output" if missing else "has a malformed output"
        raise ConfigError(
            f"stack {stack} {what} {name!r} ({problem['msg']}): `python -m infra up {stack}` "
            "writes it (no resource changes)"
        ) from None
