"""require_tool, require_root: skip on a developer machine, fail in CI, naming what is missing."""

from __future__ import annotations

import shutil

import pytest

from tests.tools import require_root, require_tool


def test_found_tool_gives_its_path():
    assert require_tool("sh", "dash") == shutil.which("sh")


@pytest.mark.parametrize("ci", [None, "false", ""])
def test_missing_tool_skips_outside_ci(monkeypatch, ci):
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    with pytest.raises(pytest.skip.Exception, match="apt-get install no-such-package"):
        require_tool("no-such-tool-here", "no-such-package")


@pytest.mark.parametrize("ci", ["true", "TRUE", "1"])
def test_missing_tool_fails_in_ci(monkeypatch, ci):
    monkeypatch.setenv("CI", ci)
    with pytest.raises(pytest.fail.Exception, match="Debian package no-such-package"):
        require_tool("no-such-tool-here", "no-such-package")


@pytest.mark.parametrize(
    ("ci", "outcome"), [("", pytest.skip.Exception), ("true", pytest.fail.Exception)]
)
def test_not_root_skips_outside_ci_and_fails_in_ci(monkeypatch, ci, outcome):
    monkeypatch.setenv("CI", ci)
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    with pytest.raises(outcome, match="needs root \\(buildah\\)"):
        require_root("buildah")


def test_root_passes(monkeypatch):
    monkeypatch.setattr("os.geteuid", lambda: 0)
    require_root("buildah")
