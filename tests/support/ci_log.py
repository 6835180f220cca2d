"""A line in the test run's own output, past pytest's capture: what the CI log shows."""

from __future__ import annotations

from collections.abc import Callable

import pytest


@pytest.fixture
def ci_log(capsys, pytestconfig) -> Callable[[str], None]:
    reporter = pytestconfig.pluginmanager.get_plugin("terminalreporter")

    def write(line: str) -> None:
        with capsys.disabled():
            reporter.write_line(line)

    return write
