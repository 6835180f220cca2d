"""Damage to a checkpoint's files on disk, as a failing disk or a torn copy would leave it."""

from __future__ import annotations

import json
from pathlib import Path

from training.checkpoint.layout import COMMIT_MARKER

# Same-size damage of each kind of file (what sizes alone cannot see).
TARGETS = ["model", "optimizer", "marker bytes", "marker digit"]


def flip_bytes(path: Path, count: int = 256) -> None:
    """Invert ``count`` bytes in the middle of the file; its size stays the same."""
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    for i in range(middle, min(middle + count, len(data))):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def edit_marker_digit(path: Path) -> None:
    """A change that still parses: one digit of a recorded size, same length."""
    text = path.read_text()
    record = json.loads(text)
    entry = next(iter(record["files"].values()))
    old = f'"size": {entry["size"]}'
    last = str(entry["size"])[-1]
    new = old[:-1] + ("1" if last != "1" else "2")
    assert text.count(old) == 1
    path.write_text(text.replace(old, new))


def damage(step_dir: Path, target: str) -> str:
    """Damage one file of ``step_dir`` in place; returns the file's name."""
    if target == "model":
        path = step_dir / "mp_rank_00_model_states.pt"
        flip_bytes(path)
    elif target == "optimizer":  # the last rank's shard: written by a rank other than 0
        path = sorted(step_dir.glob("*optim_states.pt"))[-1]
        flip_bytes(path)
    elif target == "truncation":
        path = step_dir / "mp_rank_00_model_states.pt"
        path.write_bytes(path.read_bytes()[:-100])
    elif target == "marker bytes":
        path = step_dir / COMMIT_MARKER
        flip_bytes(path, count=8)
    else:
        path = step_dir / COMMIT_MARKER
        edit_marker_digit(path)
    return path.name
