"""The stack's Pulumi config (namespace `gpu:`), checked before any resource exists.

Every key is documented in docs/stack.md. Pulumi hands config values over as
strings (structured YAML values as JSON text), so each field parses its string
strictly: `gpu:spot: yes` is an error, not a guess. A bad key or value raises
ConfigError with one sentence naming the key, the value and what would work.
"""

from __future__ import annotations

import ipaddress
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pulumi
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from common.errors import describe
from images.matrix import arch_key
from infra.config.guardrails import GuardrailConfig
from infra.errors import ConfigError
from infra.knowledge.costs import hourly_usd
from infra.knowledge.profiles import resolve_profile
from infra.knowledge.resolver import AUTO, Plan, resolve
from infra.node.boot import MAX_USER_DATA_BYTES, job_path_overrides, largest_user_data_bytes
from training.spec.config import ConfigError as TrainConfigError
from training.spec.config import load_config, validate
from training.spec.selfcheck import SelfCheckError, check_precision

# CloudWatch Logs accepts only these retention periods (PutRetentionPolicy API).
LOG_RETENTION_DAYS = (
    1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557,
    2922, 3288, 3653,
)  # fmt: skip

_S3_URI = re.compile(r"^s3://(?P<bucket>[a-z0-9][a-z0-9.-]{1,61}[a-z0-9])(?:/(?P<prefix>\S*))?$")
# Docker/OCI tag grammar: https://docs.docker.com/reference/cli/docker/image/tag/
_IMAGE_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_AVAILABILITY_ZONE = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d[a-z]$")


class S3Uri(BaseModel):
    """`s3://bucket/prefix`, split into its parts."""

    model_config = ConfigDict(frozen=True)

    bucket: str
    prefix: str

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"


class StackConfig(BaseModel):
    """All `gpu:` keys of one stack. Field aliases are the config key names."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    profile: str = "a100x8"
    instance_type: str | None = Field(None, alias="instanceType")
    image_variant: str | None = Field(None, alias="imageVariant")
    nodes: int | None = Field(None, ge=1)
    spot: bool = False
    image_tag: str | None = Field(None, alias="imageTag")
    train_config: Path | None = Field(None, alias="trainConfig")
    data_s3_uri: S3Uri | None = Field(None, alias="dataS3Uri")
    ssh_cidr: ipaddress.IPv4Network | None = Field(None, alias="sshCidr")
    root_volume_gib: int = Field(500, alias="rootVolumeGiB", ge=100, le=16384)
    log_retention_days: int = Field(30, alias="logRetentionDays")
    availability_zone: str | None = Field(None, alias="availabilityZone")
    use_default_vpc: bool = Field(False, alias="useDefaultVpc")
    guardrails: GuardrailConfig

    @field_validator("spot", "use_default_vpc", mode="before")
    @classmethod
    def _strict_bool(cls, value: Any) -> bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        raise ValueError("must be true or false")

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

    @field_validator("train_config")
    @classmethod
    def _train_config(cls, path: Path | None) -> Path | None:
        if path is None:
            return None
        if not path.is_file():
            raise ValueError(
                "not a file (give the path of a training TOML, relative to Pulumi.yaml)"
            )
        try:
            text = path.read_text()
            tomllib.loads(text)
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ValueError(f"not valid TOML ({exc})") from None
        size = largest_user_data_bytes(text)
        if size > MAX_USER_DATA_BYTES:
            raise ValueError(
                f"{len(text.encode())} bytes, which makes the user data {size} bytes, over "
                f"EC2's {MAX_USER_DATA_BYTES}: keep large settings in the image or in S3"
            )
        return path

    @property
    def train_config_text(self) -> str | None:
        return self.train_config.read_text() if self.train_config is not None else None

    def resolve_plan(self) -> Plan:
        """The profile, with any instanceType / imageVariant / nodes override, resolved."""
        try:
            profile_plan = resolve_profile(self.profile)
        except ConfigError as exc:
            raise ConfigError(f"gpu:profile is {self.profile!r}: {exc}") from None
        overrides = {
            key: value
            for key, value in (
                ("instanceType", self.instance_type),
                ("imageVariant", self.image_variant),
                ("nodes", self.nodes),
            )
            if value is not None
        }
        if not overrides:
            return profile_plan
        instance_type = self.instance_type or profile_plan.instance.type
        if self.image_variant is not None:
            variant = self.image_variant
        elif self.instance_type is None:
            variant = profile_plan.variant.name
        else:
            variant = AUTO  # the profile's variant was chosen for another instance type
        nodes = self.nodes if self.nodes is not None else profile_plan.nodes
        try:
            return resolve(instance_type, variant, nodes)
        except ConfigError as exc:
            given = ", ".join(f"gpu:{key} is {value!r}" for key, value in overrides.items())
            raise ConfigError(f"{given}: {exc}") from None

    def check_plan(self, plan: Plan) -> None:
        """The refusals that need the plan: the guardrails' (instance type allowed, budget,
        alerts) and the trainer's on gpu:trainConfig."""
        self.guardrails.check_instance_type(plan.instance.type)
        self.guardrails.check_against(hourly_usd(plan, spot=self.spot))
        if self.train_config is not None:
            self._check_train_config(plan)

    def _check_train_config(self, plan: Plan) -> None:
        """Run the trainer's own start-up checks on gpu:trainConfig against the stack's GPUs.

        The node runs them again and exits 2, but only once the instances are up and
        billing; here a job the trainer would refuse fails `pulumi preview` instead.
        A model or data builder ("package.module:function") is checked for its form only:
        its package is in the image, not in this venv, so the node checks it imports.
        """
        paths = job_path_overrides(data_from_s3=self.data_s3_uri is not None)
        try:
            job = load_config(self.train_config, env=paths)
            validate(job, world_size=plan.gpus)
            check_precision(
                bf16=job.precision.bf16,
                fp16=job.precision.fp16,
                on_gpu=True,  # every catalog instance has a GPU (gpu_count >= 1)
                capability=arch_key(plan.instance.compute_capability),
            )
        except (TrainConfigError, SelfCheckError) as exc:
            raise ConfigError(
                f"gpu:trainConfig is {str(self.train_config)!r}: the trainer would refuse it on "
                f"{plan.nodes} x {plan.instance.type} (world size {plan.gpus}, compute capability "
                f"{plan.instance.compute_capability}): {exc}"
            ) from None


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


def config_from_pulumi(config: pulumi.Config) -> dict[str, Any]:
    """Every key set in the stack's config for `config`'s namespace, without the prefix.

    pulumi.Config only answers for keys one asks about; to refuse unknown keys we
    read the whole map the language host passes in (PULUMI_CONFIG), plus any key
    set in-process (pulumi.runtime.set_config, used by the tests and the offline plan).
    """
    settings = {**pulumi.runtime.get_config_env(), **pulumi.runtime.config.CONFIG.get()}
    prefix = f"{config.name}:"
    return {
        key.removeprefix(prefix): value for key, value in settings.items() if key.startswith(prefix)
    }
