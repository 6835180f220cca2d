"""A test's `ci_log` lines reach the run's own output, from an xdist worker too."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]
REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("workers", [[], ["-p", "xdist.plugin", "-n", "2"]], ids=["alone", "xdist"])
def test_a_story_line_is_in_the_runs_output(pytester, monkeypatch, workers):
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    # Only the plugins the inner session needs: loading every installed one takes seconds.
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    pytester.makepyfile(
        test_inner="def test_a(ci_log):\n    ci_log('story: a told')\n"
        "def test_b(ci_log):\n    ci_log('story: b told')\n    assert False\n"
        "def test_quiet():\n    pass\n"
    )
    result = pytester.runpytest_subprocess("-p", "tests.support.ci_log", *workers)
    result.assert_outcomes(passed=2, failed=1)
    told = [line for line in result.outlines if line.startswith("story:")]
    assert sorted(told) == ["story: a told", "story: b told"]  # each once, a failing test's too
