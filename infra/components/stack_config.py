"""The stack's config as the Pulumi engine hands it to the program, one namespace at a time."""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Mapping
from typing import Any

import pulumi
import pulumi_aws as aws


def namespace_config(namespace: str) -> dict[str, Any]:
    """Every key set in the stack's config under `namespace` ("gpu", "aws"), without the prefix.

    pulumi.Config only answers for keys one asks about; to refuse unknown keys we read the
    whole map, which the Python language host hands the program in the PULUMI_CONFIG
    environment variable (pulumi/pulumi, sdk/python/cmd/pulumi-language-python/main.go,
    `pulumiConfigVar`), through the SDK's public `pulumi.runtime.get_config_env`. The
    offline plan hands its config over the same way (infra/dryrun/runner.py).
    """
    settings = pulumi.runtime.get_config_env()
    prefix = f"{namespace}:"
    return {
        key.removeprefix(prefix): value for key, value in settings.items() if key.startswith(prefix)
    }


def provider_settings(aws_config: Mapping[str, str]) -> dict[str, Any]:
    """The `aws:` stack settings as keyword arguments of an explicit aws.Provider.

    An explicit provider reads none of the `aws:` config itself (it would deploy into
    whatever account the ambient credentials name): every key a stack file sets that the
    provider accepts (profile, region, assumeRoles, allowedAccountIds, sharedConfigFiles...)
    is passed on. Structured values arrive as JSON text; their keys become snake_case, as the
    Python SDK names input properties. `defaultTags` is left to the caller, which adds its own.
    """
    accepted = set(inspect.signature(aws.ProviderArgs.__init__).parameters) - {"__self__"}
    settings = {}
    for key, text in aws_config.items():
        name = to_snake(key)
        if name not in accepted or name == "default_tags":
            continue
        settings[name] = _snake_keys(_parsed(text))
    return settings


def to_snake(key: str) -> str:
    """camelCase config key to the SDK's snake_case (s3UsEast1RegionalEndpoint keeps "s3")."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", key).lower()


def _parsed(text: Any) -> Any:
    if isinstance(text, str) and text.strip()[:1] in ("[", "{"):
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            return text
    return text


def _snake_keys(value: Any) -> Any:
    if isinstance(value, dict):
        return {to_snake(key): _snake_keys(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_snake_keys(item) for item in value]
    return value
