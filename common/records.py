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

from common.errors import Problem, describe

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
    except IsADirectoryError:
        raise error(f"{path} is a folder: give the TOML file") from None
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
        raise error(f"{where}, {describe(exc, name=_field, known=_known_fields(cls))}") from None


def _field(key: str) -> str:
    return f"field '{key}'"


def _known_fields(cls: type):
    """The record's own fields, for an unknown top-level field; inside a nested table the
    outer fields would mislead."""

    def known(problem: Problem) -> str | None:
        if len(problem.location) > 1:
            return None
        return ", ".join(f.name for f in dataclasses.fields(cls))

    return known


def check_keys(raw: dict[str, Any], known: set[str], *, where: str, error: type[Exception]) -> None:
    """Reject unknown top-level keys of a data file."""
    for key in raw:
        if key not in known:
            raise error(f"{where}: unknown key '{key}' (known keys: {', '.join(sorted(known))})")
