"""Where a node sits: its network interfaces and its availability zone. Pure rules, no lookups.

The components ask AWS what they need (the zones offering a type) and apply these rules, so the
rules can be tested with generated inputs and read without Pulumi.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from infra.errors import ConfigError
from infra.knowledge.resolver import Plan


@dataclass(frozen=True)
class Interface:
    network_card_index: int
    device_index: int
    interface_type: str | None  # None: a plain ENA interface


def interface_layout(plan: Plan) -> list[Interface]:
    """The network interfaces of one node, per AWS's guide for multi-card EFA types.

    Single node, or a type without EFA: one ENA interface. Multi-node on an EFA
    type: one EFA interface per network card up to the catalog's EFA count; the
    primary (card 0, device 0) is "efa" (an EFA-only interface cannot be primary),
    the others sit at device index 1, of the catalog's `efa_secondary_interface` kind.
    """
    efa_count = plan.instance.efa_interfaces
    if plan.nodes == 1 or efa_count == 0:
        return [Interface(network_card_index=0, device_index=0, interface_type=None)]
    secondary = plan.instance.efa_secondary_interface
    return [Interface(network_card_index=0, device_index=0, interface_type="efa")] + [
        Interface(network_card_index=card, device_index=1, interface_type=secondary)
        for card in range(1, efa_count)
    ]


def choose_zone(instance_type: str, requested: str | None, offered: Iterable[str]) -> str:
    """The configured zone if it offers the instance type, else the first zone (by name) that does.

    GPU types are offered in only some zones of a region; a launch in another zone
    fails late with "Unsupported". Multi-node stacks need one zone anyway (cluster
    placement group).
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
