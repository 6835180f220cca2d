"""Where a node sits: its availability zone. Pure rules, no lookups.

The components ask AWS what they need (the zones offering a type) and apply these rules, so the
rules can be tested with generated inputs and read without Pulumi.
"""

from __future__ import annotations

from collections.abc import Iterable

from infra.errors import ConfigError


def choose_zone(instance_type: str, requested: str | None, offered: Iterable[str]) -> str:
    """The configured zone if it offers the instance type, else the first zone (by name) that does.

    GPU types are offered in only some zones of a region; a launch in another zone
    fails late with "Unsupported".
    """
    zones = sorted(set(offered))
    if not zones:
        raise ConfigError(
            f"{instance_type} is not offered in any availability zone of this region; "
            "pick another region (aws:region) or instance type (gpu:instanceType)"
        )
    if requested is None:
        return zones[0]
    if requested not in zones:
        raise ConfigError(
            f"gpu:availabilityZone: {requested!r} does not offer {instance_type}; "
            f"use one of {', '.join(zones)} or leave it unset"
        )
    return requested
