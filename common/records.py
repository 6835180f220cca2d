"""Read the repository's TOML data files into frozen records, with one-line errors.

The matrix (images/) and the infra catalog both keep facts as TOML; both want
the same thing from a bad file: one line naming the file, the entry, the field,
the bad value, and what would work.
"""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path
from typing import Any, TypeVar

from pydantic import ConfigDict, ValidationError

T = TypeVar("T")

# Records refuse unknown keys. Their numbers and flags are Strict* types besides:
# "3.06" is not a price and true is not a count.
RECORD_CONFIG = ConfigDict(extra="forbid")


def read_toml(path: Path, error: type[Exception]) -> dict[str, Any]:
    """Parse `path`; a missing or malformed file raises `error` with one line."""
    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except FileNotFoundError:
        raise error(f"{path}: file not found") from None
    except tomllib.TOMLDecodeError as exc:
        raise error(f"{path}: not valid TOML: {exc}") from None


def build_record(cls: type[T], raw: Any, *, where: str, error: type[Exception]) -> T:
    """Make a pydantic dataclass from a TOML table, or raise `error` in one line.

    `where` names the entry (e.g. "instances.toml: instance 'p3.2xlarge'").
    """
    if not isinstance(raw, dict):
        raise error(f"{where}: expected a table, got {type(raw).__name__} {raw!r}")
    try:
        return cls(**raw)
    except ValidationError as exc:
        raise error(f"{where}, {describe_first_error(cls, exc)}") from None


def describe_first_error(cls: type, exc: ValidationError) -> str:
    """The first pydantic error as "field 'x': problem (got value)".

    An unknown field comes first: a misspelt key also shows up as a missing one,
    and the misspelling is the cause.
    """
    errors = exc.errors()
    unknown = [e for e in errors if e["type"] == "unexpected_keyword_argument"]
    first = (unknown or errors)[0]
    field = ".".join(str(part) for part in first["loc"]) or "?"
    if first["type"] == "unexpected_keyword_argument":
        if len(first["loc"]) > 1:  # inside a nested table: the outer fields would mislead
            return f"field '{field}': unknown field"
        known = ", ".join(f.name for f in dataclasses.fields(cls))
        return f"field '{field}': unknown field (known fields: {known})"
    if first["type"] in ("missing", "missing_argument"):
        return f"field '{field}': required but missing"
    message = first["msg"].removeprefix("Value error, ")
    return f"field '{field}': {message} (got {first['input']!r})"


def check_keys(raw: dict[str, Any], known: set[str], *, where: str, error: type[Exception]) -> None:
    """Reject unknown top-level keys of a data file."""
    for key in raw:
        if key not in known:
            raise error(f"{where}: unknown key '{key}' (known keys: {', '.join(sorted(known))})")
