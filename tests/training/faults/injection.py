"""The environment that arms inject/sitecustomize.py in a job's ranks. That module's
docstring lists the points and actions."""

from __future__ import annotations

from pathlib import Path

INJECT = Path(__file__).with_name("inject")


def fault_env(
    point: str,
    *,
    at: int | None = None,
    rank: int | None = None,
    action: str | None = None,
    flag: Path | None = None,
    pause_s: float | None = None,
    slow_s: float | None = None,
) -> dict[str, str]:
    """Environment variables that make rank ``rank`` (default 0) act at call ``at`` of
    ``point``: die (the default action), or pause or hang after making ``flag``."""
    settings = {
        "FAULT_AT": at,
        "FAULT_RANK": rank,
        "FAULT_ACTION": action,
        "FAULT_FLAG": flag,
        "FAULT_PAUSE_S": pause_s,
        "FAULT_SLOW_S": slow_s,
    }
    armed = {name: str(value) for name, value in settings.items() if value is not None}
    return {"PYTHONPATH": str(INJECT), "FAULT_POINT": point, **armed}
