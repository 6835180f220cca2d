"""The `gpu:` key tables of docs/stack.md, written from the schema's fields.

`python -m infra.config.key_table` rewrites the tables between their markers in docs/stack.md;
a test checks that the file holds what this module renders, so a key, its default and its
description are written once: in the pydantic Field.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from infra.config.guardrails import CONFIG_NAMESPACE, GuardrailConfig
from infra.config.schema import StackConfig

DOC = Path(__file__).resolve().parents[2] / "docs" / "stack.md"
# Table title -> (model, what its last column holds)
TABLES = {"stack keys": (StackConfig, "meaning"), "guardrail keys": (GuardrailConfig, "value")}


def shown_default(field: FieldInfo) -> str:
    """The default as a stack file would write it, or the field's own words for a derived one."""
    extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
    if "default_text" in extra:
        return str(extra["default_text"])
    value = field.default
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, float) and value.is_integer():
        return f"`{int(value)}`"
    if isinstance(value, tuple):
        items = [int(v) if isinstance(v, float) and v.is_integer() else v for v in value]
        return f"`{json.dumps(items)}`"
    return f"`{value}`"


def render_table(model: type[BaseModel], last_column: str = "meaning") -> str:
    """One markdown table: key, default, description, for every config key of `model`."""
    rows = [f"| key | default | {last_column} |", "|---|---|---|"]
    for name, field in model.model_fields.items():
        if name == "guardrails":  # GuardrailConfig's own table
            continue
        key = field.alias or name
        rows.append(
            f"| `{CONFIG_NAMESPACE}:{key}` | {shown_default(field)} | {field.description} |"
        )
    return "\n".join(rows)


def _markers(title: str) -> tuple[str, str]:
    return (
        f"<!-- {title}: written by python -m infra.config.key_table -->",
        f"<!-- end of {title} -->",
    )


def tables_in(text: str) -> dict[str, str]:
    """The text between each table's markers in `text` (docs/stack.md)."""
    found = {}
    for title in TABLES:
        start, end = _markers(title)
        if start in text and end in text:
            found[title] = text.split(start, 1)[1].split(end, 1)[0].strip("\n")
    return found


def write_tables(text: str) -> str:
    """`text` with each table between its markers replaced by the rendered one."""
    for title, (model, last_column) in TABLES.items():
        start, end = _markers(title)
        before, rest = text.split(start, 1)
        _, after = rest.split(end, 1)
        text = f"{before}{start}\n{render_table(model, last_column)}\n{end}{after}"
    return text


def main() -> int:
    DOC.write_text(write_tables(DOC.read_text()))
    print(f"wrote the key tables of {DOC}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
