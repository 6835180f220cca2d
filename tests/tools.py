"""External command-line tools that some tests run (cloud-init, shellcheck)."""

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
    message = (
        f"{name} not found on PATH: install the Debian package {package} "
        f"(apt-get install {package})"
    )
    if in_ci():
        pytest.fail(f"{message}; in CI a missing tool fails the test", pytrace=False)
    pytest.skip(message)
