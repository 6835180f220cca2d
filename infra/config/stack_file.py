"""A stack file, Pulumi.<stack>.yaml: its config as the Pulumi CLI hands it to the program.

The offline run (infra.dryrun.runner) and `python -m infra plan` read the same files the
Pulumi CLI does, and check them with the program's own StackConfig.
"""

from __future__ import annotations

import difflib
import json
import logging
import re
from pathlib import Path
from typing import Any

import yaml

from infra.config.schema import StackConfig, load_stack_config
from infra.errors import ConfigError
from infra.project import find_project_root

log = logging.getLogger(__name__)

REPO_ROOT = find_project_root()
NAMESPACE = "gpu:"
# The Pulumi AWS provider's settings (the `aws:` namespace), from "AWS Installation &
# Configuration", https://www.pulumi.com/registry/packages/aws/installation-configuration/
AWS_SETTINGS = frozenset(
    {
        "accessKey", "allowedAccountIds", "assumeRole", "assumeRoleWithWebIdentity",
        "customCaBundle", "defaultTags", "ec2MetadataServiceEndpoint",
        "ec2MetadataServiceEndpointMode", "endpoints", "forbiddenAccountIds", "httpProxy",
        "httpsProxy", "ignoreTags", "insecure", "maxRetries", "noProxy", "profile", "region",
        "retryMode", "s3UsePathStyle", "secretKey", "sharedConfigFiles",
        "sharedCredentialsFiles", "skipCredentialsValidation", "skipMetadataApiCheck",
        "skipRegionValidation", "skipRequestingAccountId", "stsRegion", "token",
        "tokenBucketRateLimiterCapacity", "useDualstackEndpoint", "useFipsEndpoint",
    }
)  # fmt: skip


class _Yaml12Loader(yaml.SafeLoader):
    """PyYAML's safe loader with YAML 1.2 booleans: only true and false.

    PyYAML follows YAML 1.1, where yes/no/on/off/y/n are booleans too; the Pulumi
    CLI (YAML 1.2) hands them to the program as strings, which the schema refuses.
    Reading them as strings here makes the offline plan refuse them the same way.
    """


_Yaml12Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Yaml12Loader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)


def stack_file_path(stack: str) -> Path:
    """Where the Pulumi CLI looks for stack `stack`'s config: next to Pulumi.yaml."""
    return REPO_ROOT / f"Pulumi.{stack}.yaml"


def stack_file_config(path: Path) -> dict[str, Any]:
    """The `config:` map of a Pulumi.<stack>.yaml file."""
    try:
        document = yaml.load(path.read_text(), Loader=_Yaml12Loader) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read stack file {path}: {exc}") from None
    config = document.get("config") or {}
    if not isinstance(config, dict):
        raise ConfigError(f"{path}: 'config' must be a mapping of keys to values")
    return config


def _warn_unknown_aws_settings(path: Path, config: dict[str, Any]) -> None:
    """A typo such as aws:regoin is ignored by the provider, which then uses its default."""
    for key in config:
        if key.startswith("aws:") and key.removeprefix("aws:") not in AWS_SETTINGS:
            close = difflib.get_close_matches(key.removeprefix("aws:"), AWS_SETTINGS, n=1)
            hint = f"did you mean aws:{close[0]}?" if close else "see the provider's settings"
            log.warning("%s: %s is not a setting of the AWS provider (%s)", path.name, key, hint)


def config_text(value: Any) -> str:
    """Config as the Pulumi CLI hands it over: strings, structured values as JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value)


def stack_file_region(path: Path) -> str | None:
    """The file's `aws:region`, if it sets one."""
    region = stack_file_config(path).get("aws:region")
    return None if region is None else str(region)


def load_stack_file(path: Path) -> StackConfig:
    """The checked `gpu:` config of a stack file; a bad key or value names the file."""
    config = stack_file_config(path)
    _warn_unknown_aws_settings(path, config)
    own = {
        key.removeprefix(NAMESPACE): config_text(value)
        for key, value in config.items()
        if key.startswith(NAMESPACE)
    }
    try:
        return load_stack_config(own)
    except ConfigError as exc:
        raise ConfigError(f"{path.name}: {exc}") from None
