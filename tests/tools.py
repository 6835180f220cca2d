"""What some tests need from the machine: external tools (cloud-init, shellcheck), root."""

from __future__ import annotations

import os
import shutil

import pytest


def in_ci() -> bool:
    """CI systems (GitHub Actions, GitLab, ...) set CI=true."""
    return os.environ.get("CI", "").strip().lower() in ("true", "1")


def require_tool(name: str, package: str) -> str:
    """The path of `name` on PATH, or skip the test (fail it in CI) saying what to install.

    A developer machine may lack the tool; CI must not silently lose the test.
    """
    path = shutil.which(name)
    if path is not None:
        return path
    _unavailable(
        f"{name} not found on PATH: install the Debian package {package} "
        f"(apt-get install {package})"
    )


def require_root(why: str) -> None:
    """Skip the test unless it runs as root (fail it in CI, which runs as root)."""
    if os.geteuid() != 0:
        _unavailable(f"needs root ({why})")


def _unavailable(message: str) -> None:
    if in_ci():
        pytest.fail(f"{message}; in CI a missing requirement fails the test", pytrace=False)
    pytest.skip(message)
