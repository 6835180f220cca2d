"""The stack's config as the Pulumi engine hands it to the program, one namespace at a time."""

from __future__ import annotations

from typing import Any

import pulumi


def namespace_config(namespace: str) -> dict[str, Any]:
    """Every key set in the stack's config under `namespace` ("gpu", "aws"), without the prefix.

    pulumi.Config only answers for keys one asks about; to refuse unknown keys we
    read the whole map the language host passes in (PULUMI_CONFIG), plus any key
    set in-process (pulumi.runtime.set_config, used by the tests and the offline plan).
    """
    settings = {**pulumi.runtime.get_config_env(), **pulumi.runtime.config.CONFIG.get()}
    prefix = f"{namespace}:"
    return {
        key.removeprefix(prefix): value for key, value in settings.items() if key.startswith(prefix)
    }
