"""The stack's availability zone, chosen once and kept.

Without `gpu:availabilityZone`, the zone is the first (by name) that offers the instance
type. Recomputed on every run, that choice would move when AWS's offering list changes, and
a moved zone replaces the subnet and every node in it. `KeptZone` is a Pulumi dynamic
resource that records the zone chosen at the stack's first `pulumi up` and keeps it: a later
different choice is not a change. A zone set in `gpu:availabilityZone` is followed.
"""

from __future__ import annotations

from typing import Any

import pulumi
from pulumi.dynamic import CreateResult, DiffResult, ResourceProvider


class KeptZoneProvider(ResourceProvider):
    def create(self, props: dict[str, Any]) -> CreateResult:
        return CreateResult(id_=props["zone"], outs=props)

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        # Only a zone the user set moves the stack; a recomputed first choice does not.
        moved = news.get("configured") and olds.get("zone") != news.get("zone")
        return DiffResult(changes=bool(moved), replaces=["zone"] if moved else [])


class KeptZone(pulumi.dynamic.Resource):
    """`zone` is the zone of the stack's first `pulumi up`, or the configured one."""

    zone: pulumi.Output[str]

    def __init__(
        self,
        name: str,
        *,
        zone: str,
        configured: bool,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__(KeptZoneProvider(), name, {"zone": zone, "configured": configured}, opts)
