"""The policy pack's default allow-list of GPU instance types, written into the pack's folder.

`pulumi policy publish` uploads only policy/, so the pack cannot read the catalog from
infra/; `python -m infra.knowledge.policy_allowlist` writes the catalog's instance types into
policy/allowed_instance_types.toml, and a test checks that file against the catalog.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from infra.knowledge.catalog import Catalog, load_catalog

ALLOWLIST = Path(__file__).resolve().parents[2] / "policy" / "allowed_instance_types.toml"


def allowlist_text(catalog: Catalog | None = None) -> str:
    """The allow-list file: every catalog instance type, sorted."""
    catalog = catalog if catalog is not None else load_catalog()
    types = sorted(catalog.instances)
    return (
        "# The GPU instance types the policy pack allows by default: the stack's catalog.\n"
        "# Written by `python -m infra.knowledge.policy_allowlist` from\n"
        "# infra/knowledge/data/instances.toml; do not edit by hand.\n"
        f"instance_types = {json.dumps(types)}\n"
    )


def main() -> int:
    ALLOWLIST.write_text(allowlist_text())
    print(f"wrote {ALLOWLIST}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
