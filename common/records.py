"""Read the repository's TOML data files into frozen records, with one-line errors.

The matrix (images/) and the infra catalog both keep facts as TOML; both want
the same thing from a bad file: one line naming the file, the entry, the field,
the bad value, and what would work. `DataFile` reads a file and builds its
tables into `record` classes; every problem is raised as the caller's error
class, worded by common.errors.describe.
"""

from __future__ import annotations

import dataclasses
import re
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, dataclass_transform

from pydantic import ConfigDict, ValidationError
from pydantic.dataclasses import dataclass as pydantic_dataclass

from common.errors import Problem, describe

T = TypeVar("T")

# Records refuse unknown keys. Their numbers and flags are Strict* types besides:
# "3.06" is not a price and true is not a count.
_RECORD_CONFIG = ConfigDict(extra="forbid")


@dataclass_transform(frozen_default=True)
def record(cls: type[T]) -> type[T]:
    """A frozen pydantic dataclass that refuses unknown keys: one entry of a data file."""
    return pydantic_dataclass(frozen=True, config=_RECORD_CONFIG)(cls)


def matching(pattern: str, reason: str) -> Callable[[str], str]:
    """A field validator: the whole value matches `pattern`, else ValueError(`reason`)."""
    compiled = re.compile(pattern)

    def check(value: str) -> str:
        if not compiled.fullmatch(value):
            raise ValueError(reason)
        return value

    return check


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


@dataclass(frozen=True)
class DataFile:
    """A parsed data file; what is wrong in it raises `error`, one line naming the file."""

    name: str  # the file's name, as every message starts
    raw: dict[str, Any]
    error: type[Exception]

    @classmethod
    def read(cls, path: Path, keys: set[str], error: type[Exception]) -> DataFile:
        """Parse `path` and refuse a top-level key outside `keys`."""
        raw = read_toml(path, error)
        for key in raw:
            if key not in keys:
                raise error(
                    f"{path.name}: unknown key '{key}' (known keys: {', '.join(sorted(keys))})"
                )
        return cls(path.name, raw, error)

    def fail(self, problem: str) -> Exception:
        """The error to raise for a problem with the whole file."""
        return self.error(f"{self.name}: {problem}")

    def table(self, cls: type[T], key: str) -> T:
        """The [key] table as a record."""
        return build_record(cls, self.raw.get(key), where=f"{self.name}: [{key}]", error=self.error)

    def tables(
        self, cls: type[T], key: str, *, name_field: str | None = None, header: str | None = None
    ) -> dict[str, T]:
        """Each [key.NAME] table as a record, by NAME.

        `name_field`: the record field NAME fills (the table may not set it itself).
        `header`: at least one table is needed; the message shows it as [header].
        """
        tables = self.raw.get(key, {})
        if not isinstance(tables, dict):
            raise self.fail(f"'{key}' must be tables [{header or key + '.NAME'}]")
        records = {}
        for name, table in tables.items():
            where = self.where(key, name)
            if name_field is not None and isinstance(table, dict):
                if name_field in table:
                    raise self.error(
                        f"{where}, field '{name_field}': set by the table name, remove it"
                    )
                table = {name_field: name, **table}
            records[name] = build_record(cls, table, where=where, error=self.error)
        if header is not None and not records:
            raise self.fail(f"no [{header}] tables")
        return records

    def where(self, key: str, name: str) -> str:
        """How messages name the [key.NAME] table."""
        return f"{self.name}: {key} '{name}'"


def build_record(cls: type[T], raw: Any, *, where: str, error: type[Exception]) -> T:
    """Make a record from a TOML table, or raise `error` in one line.

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
