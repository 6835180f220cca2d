"""How the `gpu:` models read a Pulumi config string as a value: strictly, one rule per kind.

Pulumi hands every config value over as a string, so `gpu:spot: yes` arrives as "yes": a
switch takes only true or false (any case), never a guess.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator


def _strict_bool(value: Any) -> Any:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise ValueError("must be true or false")


ConfigBool = Annotated[bool, BeforeValidator(_strict_bool)]
