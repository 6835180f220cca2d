"""What a command gives back when its exit status is not simply 0: the text and the code."""

from __future__ import annotations

from typing import NamedTuple


class Outcome(NamedTuple):
    text: str
    exit_code: int
