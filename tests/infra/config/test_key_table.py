"""docs/stack.md's key tables are the schema's fields: every key, its default, its description."""

from __future__ import annotations

import re

from pydantic import BaseModel, Field

from infra.config.key_table import DOC, TABLES, render_table, tables_in, write_tables


def test_docs_hold_the_tables_the_schema_renders():
    found = tables_in(DOC.read_text())
    for title, (model, last_column) in TABLES.items():
        assert found.get(title) == render_table(model, last_column), (
            f"docs/stack.md's {title} are out of date: run python -m infra.config.key_table"
        )


def test_documented_defaults_are_what_an_empty_config_gets():
    """Read the documented defaults back and compare with a config that sets nothing."""
    text = DOC.read_text()
    rows = dict(re.findall(r"^\| `gpu:(\w+)` \| `([^`]+)` \|", text, flags=re.MULTILINE))
    assert rows["rootVolumeGiB"] == "500" and rows["logRetentionDays"] == "30"
    assert rows["budgetUsd"] == "100" and rows["budgetPeriod"] == "MONTHLY"
    assert rows["actualThresholdsPercent"] == "[50, 80, 100]"
    assert rows["spot"] == "false" and rows["allowNoAlerts"] == "false"


class _Example(BaseModel):
    size_gib: int = Field(8, alias="sizeGiB", description="how big")
    ratios: tuple[float, ...] = Field((0.5, 1.0), description="fractions")
    name: str | None = Field(None, description="a name", json_schema_extra={"default_text": "x"})


def test_a_table_shows_alias_default_and_description():
    assert render_table(_Example).splitlines()[2:] == [
        "| `gpu:sizeGiB` | `8` | how big |",
        "| `gpu:ratios` | `[0.5, 1]` | fractions |",
        "| `gpu:name` | x | a name |",
    ]


def test_writing_replaces_only_what_lies_between_the_markers():
    text = DOC.read_text()
    stale = text.replace("| `gpu:spot` | `false` |", "| `gpu:spot` | `true` |")
    assert stale != text
    assert write_tables(stale) == text
