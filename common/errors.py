"""Bad input, in one sentence: the one ConfigError, and pydantic errors told alike.

`ConfigError` is raised by the stack side (infra) and the trainer (training) alike;
the command line prints it without a traceback and exits 2 (training.contract's
BAD_CONFIG), `pulumi preview` fails with it.

Everything that validates input with pydantic (the `gpu:` stack config, the
training config, the data files) reports its first problem through `describe`,
so a misspelt key, a missing one and a bad value read alike everywhere:

    train.stepz: unknown key (known keys: steps, global_batch_size)
    gpu:budgetUsd is '-5': must be at least 1; use dollars per month, e.g. 500
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import ValidationError


class ConfigError(ValueError):
    """Bad configuration, in one sentence: what is wrong and what would work."""


_UNKNOWN = ("extra_forbidden", "unexpected_keyword_argument")
_MISSING = ("missing", "missing_argument", "missing_keyword_argument")
_BOUNDS = {
    "greater_than_equal": ("ge", "must be at least {}"),
    "less_than_equal": ("le", "must be at most {}"),
    "greater_than": ("gt", "must be more than {}"),
    "less_than": ("lt", "must be less than {}"),
}


@dataclass(frozen=True)
class Problem:
    """The first thing wrong with an input, as the sentence needs it."""

    location: tuple[str, ...]  # ("train", "steps"); () for a check across keys
    kind: Literal["unknown", "missing", "invalid"]
    reason: str  # starts lower-case, no final period
    value: Any

    @property
    def key(self) -> str:
        return ".".join(self.location)


def first_problem(error: ValidationError) -> Problem:
    """The problem to report. An unknown key comes first: a misspelt key also shows up
    as a missing one, and the misspelling is the cause."""
    errors = error.errors(include_url=False)
    unknown = [e for e in errors if e["type"] in _UNKNOWN]
    first = (unknown or errors)[0]
    location = tuple(str(part) for part in first["loc"])
    if first["type"] in _UNKNOWN:
        return Problem(location, "unknown", "unknown key", first.get("input"))
    if first["type"] in _MISSING:
        return Problem(location, "missing", "required but missing", None)
    if first["type"] in _BOUNDS:
        bound, text = _BOUNDS[first["type"]]
        reason = text.format(_number(first["ctx"][bound]))
    else:
        reason = first["msg"].removeprefix("Value error, ").rstrip(".")
        if location:  # a check across keys names them itself, capitalised
            reason = reason[:1].lower() + reason[1:]
    return Problem(location, "invalid", reason, first.get("input"))


def _number(value: Any) -> str:
    """1.0 reads as 1, 0.5 as 0.5: bounds come from Field(gt=0.0) as well as ge=1."""
    return f"{value:g}" if isinstance(value, float) else str(value)


def describe(
    error: ValidationError,
    *,
    name: Callable[[str], str] = str,
    raw: Mapping[str, Any] | None = None,
    known: Callable[[Problem], str | None] | None = None,
    hint: Callable[[str], str | None] | None = None,
) -> str:
    """The first problem as one sentence.

    `name` turns the dotted key into what the user typed (e.g. "gpu:budgetUsd");
    `raw` gives the value as the user wrote it, by top-level key; `known` lists
    the keys an unknown key could have meant; `hint` says what would work.
    """
    problem = first_problem(error)
    if not problem.location:
        return problem.reason
    key = name(problem.key)
    if problem.kind == "unknown":
        keys = known(problem) if known else None
        return f"{key}: unknown key" + (f" (known keys: {keys})" if keys else "")
    if problem.kind == "missing":
        return f"{key}: required but missing"
    value = raw.get(problem.location[0], problem.value) if raw is not None else problem.value
    sentence = f"{key} is {value!r}: {problem.reason}"
    advice = hint(problem.key) if hint else None
    return f"{sentence}; use {advice}" if advice else sentence
