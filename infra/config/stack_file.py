"""A stack file, Pulumi.<stack>.yaml: its config as the Pulumi CLI hands it to the program.

The offline run (infra.dryrun.runner) and `python -m infra plan` read the same files the
Pulumi CLI does, and check them with the program's own StackConfig.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from infra.config.schema import StackConfig, load_stack_config
from infra.errors import ConfigError

REPO_ROOT = Path(__file__).resolve().parents[2]
NAMESPACE = "gpu:"


def stack_file_path(stack: str) -> Path:
    """Where the Pulumi CLI looks for stack `stack`'s config: next to Pulumi.yaml."""
    return REPO_ROOT / f"Pulumi.{stack}.yaml"


def stack_file_config(path: Path) -> dict[str, Any]:
    """The `config:` map of a Pulumi.<stack>.yaml file."""
    try:
        document = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read stack file {path}: {exc}") from None
    config = document.get("config") or {}
    if not isinstance(config, dict):
        raise ConfigError(f"{path}: 'config' must be a mapping of keys to values")
    return config


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
