"""The stack's Pulumi config (namespace `gpu:`), checked before any resource exists.

Values only: resolving the plan, reading gpu:trainConfig and the checks that need the plan
are infra/planning.py's.

Every key is documented in docs/stack.md. Pulumi hands config values over as
strings (structured YAML values as JSON text), so each field parses its string
strictly: `gpu:spot: yes` is an error, not a guess. A bad key or value raises
ConfigError with one sentence naming the key, the value and what would work.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from common.errors import describe
from common.market import Market
from infra.config.guardrails import GuardrailConfig
from infra.config.values import ConfigBool
from infra.errors import ConfigError
from infra.knowledge.resolver import MAX_NODES

# CloudWatch Logs accepts only these retention periods (PutRetentionPolicy API).
LOG_RETENTION_DAYS = (
    1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557,
    2922, 3288, 3653,
)  # fmt: skip

_S3_URI = re.compile(r"^s3://(?P<bucket>[a-z0-9][a-z0-9.-]{1,61}[a-z0-9])(?:/(?P<prefix>\S*))?$")
# Docker/OCI tag grammar: https://docs.docker.com/reference/cli/docker/image/tag/
_IMAGE_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_IMAGE_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_RESERVATION_ID = re.compile(r"^cr-[0-9a-f]{8,17}$")
_AVAILABILITY_ZONE = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d[a-z]$")


class S3Uri(BaseModel):
    """`s3://bucket/prefix`, split into its parts."""

    model_config = ConfigDict(frozen=True)

    bucket: str
    prefix: str

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"


class StackConfig(BaseModel):
    """All `gpu:` keys of one stack: each key is its field's name in camelCase, as for
    GuardrailConfig."""

    model_config = ConfigDict(frozen=True, extra="forbid", alias_generator=to_camel)

    profile: str = Field(
        "a100x8",
        description="named workload from infra/knowledge/data/profiles.toml: instance type, "
        "image variant, nodes",
    )
    instance_type: str | None = Field(
        None,
        description="another catalog instance type (infra/knowledge/data/instances.toml); the "
        "image variant is then chosen again for it unless `gpu:imageVariant` is set",
        json_schema_extra={"default_text": "the profile's"},
    )
    image_variant: str | None = Field(
        None,
        description="image variant from images/matrix.toml (`cu128`, `cu130`, ... or "
        "`auto`); refused when its CUDA cannot run on the GPU or no AMI's driver runs it",
        json_schema_extra={"default_text": "the profile's (`auto`)"},
    )
    nodes: int | None = Field(
        None,
        ge=1,
        le=MAX_NODES,
        description=f"number of nodes, 1 to {MAX_NODES}; more than 1 needs `gpu:cluster: slurm` "
        "(the queue's node limit). Without EFA the plan warns that NCCL falls back to TCP",
        json_schema_extra={"default_text": "the profile's (1)"},
    )
    spot: ConfigBool = Field(
        False,
        description="`true`: spot instances (persistent request, stop on interruption); "
        "`false`: on-demand. Only `true` or `false`",
    )
    image_tag: str | None = Field(
        None,
        description="tag of the training image in the stack's ECR repository",
        json_schema_extra={
            "default_text": "the variant's release tag, e.g. `0.1.0-torch2.13.0-cu130-py3.12`"
        },
    )
    image_digest: str | None = Field(
        None,
        description="`sha256:<64 hex digits>`: nodes pull the image by this digest (the "
        "`name:tag@sha256:...` a release or `python -m images push` prints), so what runs is "
        "exactly what was tested, whatever the tag holds",
        json_schema_extra={"default_text": "none: nodes pull by tag"},
    )
    train_config: Path | None = Field(
        None,
        description="path (relative to Pulumi.yaml) of a training TOML shipped to every node in "
        "user data (about 5 KiB at most: user data must stay under EC2's 16 KB; no secrets); "
        "the container gets `TRAIN_CONFIG`. Checked at preview by the trainer's own code "
        "against the stack's GPUs (see below). Unset: the image's default job. Each example "
        "`Pulumi.<profile>.yaml` sets its profile's job, `jobs/<profile>.toml` "
        '(docs/training.md, "Workloads")',
    )
    data_s3_uri: S3Uri | None = Field(
        None,
        description="`s3://bucket/prefix` synced into `/scratch/data` on every boot; the "
        "container gets `TRAIN_DATA_PATH`; the role may read that prefix only",
    )
    ssh_cidr: ipaddress.IPv4Network | None = Field(
        None,
        description="an IPv4 CIDR allowed to reach port 22; `0.0.0.0/0` is refused. Use SSM "
        "instead when you can",
        json_schema_extra={"default_text": "unset (no SSH)"},
    )
    root_volume_gib: int = Field(
        500,
        alias="rootVolumeGiB",  # not to_camel's rootVolumeGib
        ge=100,
        le=16384,
        description="encrypted gp3 root volume (100-16384 GiB): the image, checkpoints and run "
        "output live there",
    )
    log_retention_days: int = Field(
        30,
        description="retention of the stack's CloudWatch Logs group (a CloudWatch value: 1, 3, "
        "5, 7, 14, 30, 60, 90, ...)",
    )
    availability_zone: str | None = Field(
        None,
        description="zone for every node; refused when it does not offer the instance type",
        json_schema_extra={"default_text": "the first zone that offers the type"},
    )
    use_default_vpc: ConfigBool = Field(
        False,
        description="`true`: use the account's default VPC and its default subnet in the zone "
        "instead of creating a VPC",
    )
    capacity_reservation_id: str | None = Field(
        None,
        description="an On-Demand Capacity Reservation (`cr-...`) the nodes launch into: "
        "capacity held for you, billed at the on-demand rate from its start until cancelled, "
        "used or not. Not with `gpu:spot`",
    )
    capacity_block_id: str | None = Field(
        None,
        description="the reservation id (`cr-...`) of an EC2 Capacity Block for ML the nodes "
        "launch into (market type `capacity-block`): GPU time bought up front for fixed dates. "
        "Not with `gpu:spot` or `gpu:capacityReservationId`",
    )
    cluster: Literal["slurm"] | None = Field(
        None,
        description="`slurm`: an AWS ParallelCluster Slurm cluster (head node and a GPU queue "
        "of up to `gpu:nodes` nodes that scales to zero) instead of EC2 nodes; see "
        '"Slurm cluster" below',
        json_schema_extra={"default_text": "unset (EC2 nodes)"},
    )
    parallel_cluster_version: str | None = Field(
        None,
        description="ParallelCluster release of the cluster (infra/knowledge/data/"
        "parallelcluster.toml); its AMIs' NVIDIA driver must run the image variant "
        "(3.14.0: 570.172.08, no `cu130`). Only with `gpu:cluster`",
        json_schema_extra={"default_text": "the file's default (`3.15.1`)"},
    )
    delete_data_on_destroy: ConfigBool = Field(
        False,
        description="`true`: `pulumi destroy` also deletes the checkpoint bucket with every "
        "object version and the image repository with its images; `false`: destroy keeps them, "
        "as they are, and lists them (docs/costs.md)",
    )
    guardrails: GuardrailConfig

    @field_validator("nodes", "root_volume_gib", "log_retention_days", mode="before")
    @classmethod
    def _strict_int(cls, value: Any) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str) and re.fullmatch(r"\d+", value.strip()):
            return int(value)
        raise ValueError("must be a whole number")

    @field_validator("image_tag")
    @classmethod
    def _image_tag(cls, value: str | None) -> str | None:
        if value is not None and not _IMAGE_TAG.match(value):
            raise ValueError("not a valid image tag (letters, digits, '_', '.', '-'; at most 128)")
        return value

    @field_validator("image_digest")
    @classmethod
    def _image_digest(cls, value: str | None) -> str | None:
        if value is not None and not _IMAGE_DIGEST.fullmatch(value):
            raise ValueError("not an image digest: write sha256: and its 64 lower-case hex digits")
        return value

    @field_validator("data_s3_uri", mode="before")
    @classmethod
    def _s3_uri(cls, value: Any) -> S3Uri:
        match = _S3_URI.match(value) if isinstance(value, str) else None
        if match is None:
            raise ValueError("must look like s3://bucket-name/prefix (lower-case bucket name)")
        return S3Uri(bucket=match["bucket"], prefix=(match["prefix"] or "").rstrip("/"))

    @field_validator("ssh_cidr", mode="before")
    @classmethod
    def _ssh_cidr(cls, value: Any) -> ipaddress.IPv4Network:
        try:
            network = ipaddress.IPv4Network(value, strict=True)
        except (ValueError, TypeError):
            raise ValueError("must be an IPv4 CIDR such as 203.0.113.7/32") from None
        if network.prefixlen == 0:
            raise ValueError(
                "would open SSH to the whole internet; give your own address (e.g. "
                "203.0.113.7/32) or leave it unset and use SSM Session Manager"
            )
        return network

    @field_validator("log_retention_days")
    @classmethod
    def _retention(cls, value: int) -> int:
        if value not in LOG_RETENTION_DAYS:
            allowed = ", ".join(map(str, LOG_RETENTION_DAYS))
            raise ValueError(f"not a CloudWatch Logs retention period; use one of {allowed}")
        return value

    @field_validator("availability_zone")
    @classmethod
    def _zone(cls, value: str | None) -> str | None:
        if value is not None and not _AVAILABILITY_ZONE.match(value):
            raise ValueError("must be an availability zone name such as us-east-1a")
        return value

    @field_validator("capacity_reservation_id", "capacity_block_id")
    @classmethod
    def _reservation_id(cls, value: str | None) -> str | None:
        if value is not None and not _RESERVATION_ID.match(value):
            raise ValueError("must be a capacity reservation id such as cr-0123456789abcdef0")
        return value

    @model_validator(mode="after")
    def _one_way_to_buy(self) -> StackConfig:
        chosen = [
            key
            for key, on in (
                ("gpu:spot", self.spot),
                ("gpu:capacityReservationId", self.capacity_reservation_id is not None),
                ("gpu:capacityBlockId", self.capacity_block_id is not None),
            )
            if on
        ]
        if len(chosen) > 1:
            raise ValueError(
                f"{' and '.join(chosen)} are both set, but a node is bought one way only: "
                "spot, in a capacity reservation, or in a capacity block; keep one"
            )
        return self

    @model_validator(mode="after")
    def _more_nodes_on_the_cluster(self) -> StackConfig:
        # One scale-out path: more than one node is a Slurm cluster, never EC2 nodes.
        if self.nodes is not None and self.nodes > 1 and self.cluster is None:
            raise ValueError(
                f"gpu:nodes is {self.nodes}, but more than one node runs on a Slurm cluster "
                "only; set gpu:cluster: slurm or set gpu:nodes to 1"
            )
        return self

    @model_validator(mode="after")
    def _cluster_in_the_stacks_vpc(self) -> StackConfig:
        # The cluster's nodes reach AWS through the stack's NAT gateway, from a private
        # subnet the stack creates (infra/components/network.py); a default VPC has neither.
        if self.use_default_vpc and self.cluster is not None:
            raise ValueError(
                "gpu:useDefaultVpc is true, but a Slurm cluster needs the private subnet and "
                "NAT gateway of the stack's own VPC; remove gpu:useDefaultVpc"
            )
        return self

    @property
    def market(self) -> Market:
        """How the nodes are bought."""
        if self.spot:
            return Market.SPOT
        if self.capacity_block_id is not None:
            return Market.CAPACITY_BLOCK
        if self.capacity_reservation_id is not None:
            return Market.RESERVATION
        return Market.ON_DEMAND


def stack_region(aws_region: str | None, environ: Mapping[str, str] = os.environ) -> str:
    """The region the stack deploys to, found as the AWS provider finds it: `aws:region`, else
    AWS_REGION, else AWS_DEFAULT_REGION (Pulumi AWS provider, "Installation & Configuration",
    pulumi.com/registry/packages/aws/installation-configuration/)."""
    for region in (aws_region, environ.get("AWS_REGION"), environ.get("AWS_DEFAULT_REGION")):
        if region:
            return region
    raise ConfigError(
        "aws:region is not set, so the stack's prices and region are unknown; set it with "
        "pulumi config set aws:region us-east-1 (or another region with prices)"
    )


def own_keys() -> tuple[str, ...]:
    """The config keys StackConfig reads itself (the guardrail keys are GuardrailConfig's)."""
    return tuple(
        field.alias or name
        for name, field in StackConfig.model_fields.items()
        if name != "guardrails"
    )


def load_stack_config(raw: Mapping[str, Any]) -> StackConfig:
    """Check the `gpu:` keys (given without their prefix) and build the StackConfig."""
    guardrail_keys = set(GuardrailConfig.config_keys())
    known = set(own_keys()) | guardrail_keys
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ConfigError(
            f"gpu:{unknown[0]} is not a config key of this stack (value {raw[unknown[0]]!r}); "
            f"check the spelling against {', '.join(f'gpu:{key}' for key in sorted(known))}"
        )
    guardrails = GuardrailConfig.from_config(
        {key: value for key, value in raw.items() if key in guardrail_keys}
    )
    mine = {key: value for key, value in raw.items() if key not in guardrail_keys}
    try:
        return StackConfig.model_validate({**mine, "guardrails": guardrails})
    except ValidationError as exc:
        raise ConfigError(describe(exc, name=lambda key: f"gpu:{key}", raw=mine)) from None
