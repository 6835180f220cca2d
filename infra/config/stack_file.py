"""A stack file, Pulumi.<stack>.yaml: its config as the Pulumi CLI hands it to the program.

The offline run (infra.dryrun.runner) and `python -m infra plan` read the same files the
Pulumi CLI does, and check them with the program's own StackConfig.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from infra.config.schema import StackConfig, load_stack_config
from infra.errors import ConfigError
from infra.outputs import LOCAL
from infra.project import find_project_root

REPO_ROOT = find_project_root()
NAMESPACE = "gpu:"
# The top-level keys of a stack settings file (Pulumi docs, "Stack settings file reference",
# https://www.pulumi.com/docs/iac/concepts/projects/stack-settings-file/).
SETTINGS_KEYS = frozenset(
    {"secretsprovider", "encryptedkey", "encryptionsalt", "config", "environment"}
)
# The config namespaces anything here reads: this program's (gpu:), the AWS provider's (aws:)
# and Pulumi's own (pulumi:, e.g. pulumi:disable-default-providers). A key without one is
# the project's namespace, which nothing reads.
NAMESPACES = ("gpu", "aws", "pulumi")
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


def _mapping_without_duplicates(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict:
    """A YAML mapping, refusing a key given twice: PyYAML would keep the last silently."""
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        line = key_node.start_mark.line + 1
        if key in seen:
            raise ConfigError(
                f"{key} is given twice (lines {seen[key]} and {line}): keep one of them"
            )
        seen[key] = line
    return loader.construct_mapping(node)


_Yaml12Loader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_without_duplicates
)


def stack_file_path(stack: str) -> Path:
    """Where the Pulumi CLI looks for stack `stack`'s config: next to Pulumi.yaml."""
    if stack == LOCAL:
        raise ConfigError(
            f"stack {LOCAL} is this machine: it has no stack file and nothing to plan or "
            f"create; `python -m infra run {LOCAL} --config JOB.toml` starts a job on it"
        )
    return REPO_ROOT / f"Pulumi.{stack}.yaml"


def _closest(word: str, choices: Iterable[str]) -> str | None:
    close = difflib.get_close_matches(word, list(choices), n=1)
    return close[0] if close else None


def stack_file_config(path: Path) -> dict[str, Any]:
    """The `config:` map of a Pulumi.<stack>.yaml file, its keys checked (see _check_keys)."""
    try:
        document = yaml.load(path.read_text(), Loader=_Yaml12Loader) or {}
    except IsADirectoryError:
        raise ConfigError(f"{path} is a folder: give the stack file, Pulumi.<stack>.yaml") from None
    except FileNotFoundError:
        raise ConfigError(
            f"no stack file {path.name} next to Pulumi.yaml: copy one of the examples "
            "(Pulumi.a100x8.yaml, ...) to it and set gpu:alertEmails"
        ) from None
    except (OSError, yaml.YAMLError, UnicodeDecodeError) as exc:
        reason = str(exc).replace("\n", " ")
        raise ConfigError(f"cannot read stack file {path}: {reason}") from None
    except ConfigError as exc:
        raise ConfigError(f"{path.name}: {exc}") from None
    if not isinstance(document, dict):
        raise ConfigError(f"{path.name}: expected a mapping with a 'config:' block")
    for key in document:
        if key not in SETTINGS_KEYS:
            close = _closest(str(key), SETTINGS_KEYS)
            hint = f"did you mean {close}?" if close else "settings go under 'config:'"
            raise ConfigError(
                f"{path.name}: top-level key {key!r} is not one Pulumi reads ({hint})"
            )
    config = document.get("config") or {}
    if not isinstance(config, dict):
        raise ConfigError(f"{path.name}: 'config' must be a mapping of keys to values")
    _check_keys(path, config)
    return config


def _check_keys(path: Path, config: dict[str, Any]) -> None:
    """Refuse a key nothing reads: an unknown namespace (gpus:budgetUsd, or none) or an AWS
    provider setting it does not have (aws:regoin, which the provider ignores, pricing and
    deploying the stack in its default region)."""
    for key in map(str, config):
        namespace, colon, name = key.partition(":")
        if not colon or namespace not in NAMESPACES:
            close = _closest(namespace, NAMESPACES) if colon else NAMESPACE.rstrip(":")
            fix = f"did you mean {close}:{name or key}? " if close else ""
            raise ConfigError(
                f"{path.name}: {key} is in no namespace anything here reads: {fix}(this "
                "program reads gpu: keys, the AWS provider aws: keys)"
            )
        if namespace == "aws" and name not in AWS_SETTINGS:
            close = _closest(name, AWS_SETTINGS)
            raise ConfigError(
                f"{path.name}: {key} is not a setting of the AWS provider: "
                f"{f'did you mean aws:{close}? ' if close else ''}(its settings: "
                "https://www.pulumi.com/registry/packages/aws/installation-configuration/)"
            )


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
    own = {
        key.removeprefix(NAMESPACE): config_text(value)
        for key, value in config.items()
        if key.startswith(NAMESPACE)
    }
    try:
        return load_stack_config(own)
    except ConfigError as exc:
        raise ConfigError(f"{path.name}: {exc}") from None
