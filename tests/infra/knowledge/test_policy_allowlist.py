"""The policy pack's own allow-list is the catalog's instance types, written into policy/."""

from __future__ import annotations

import tomllib
from pathlib import Path

from infra.knowledge.catalog import load_catalog
from infra.knowledge.policy_allowlist import ALLOWLIST, allowlist_text
from policy import rules

REPO_ROOT = Path(__file__).resolve().parents[3]


def test_the_pack_folder_holds_the_catalogs_types():
    catalog_types = sorted(
        tomllib.loads((REPO_ROOT / "infra/knowledge/data/instances.toml").read_text())["instance"]
    )
    written = tomllib.loads(ALLOWLIST.read_text())["instance_types"]
    assert written == catalog_types, "run python -m infra.knowledge.policy_allowlist"
    assert ALLOWLIST.read_text() == allowlist_text()
    assert ALLOWLIST.parent == REPO_ROOT / "policy"


def test_the_pack_reads_its_own_copy():
    assert rules.catalog_instance_types() == tuple(sorted(load_catalog().instances))
