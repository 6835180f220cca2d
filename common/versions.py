"""Dotted version numbers (drivers, CUDA), compared one way everywhere.

The resolver, the image matrix and the container's start-up driver check call
version_key; the boot script's shell check (infra/node/templates/run-training.sh)
is tested against it.
"""

from __future__ import annotations

import re

_VERSION = re.compile(r"^\d+(\.\d+)*$")


def version_key(version: str) -> tuple[int, ...]:
    """Numbers for comparison, trailing zeros dropped: 570.195.03 -> (570, 195, 3).

    570.26 and 570.26.00 are one version, as the image's start-up check
    (training/spec/selfcheck.py) and the boot script's driver check judge them.
    """
    if not _VERSION.match(version):
        raise ValueError(f"not a dotted version number: {version!r}")
    parts = [int(part) for part in version.split(".")]
    while len(parts) > 1 and parts[-1] == 0:
        parts.pop()
    return tuple(parts)


def dotted_version(value: str | None) -> str | None:
    """Pydantic validator: a dotted version number (or None)."""
    if value is not None:
        version_key(value)
    return value
