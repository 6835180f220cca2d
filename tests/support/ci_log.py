"""A line in the test run's own output, past pytest's capture: what the CI log shows.

A test says its story with the `ci_log` fixture. The line travels with the test's report
(`user_properties`), so it reaches the log from an xdist worker too: a worker's own
terminal output is not shown, only what its reports carry back to the main process,
which prints the lines when the test ends.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

CI_LOG = "ci_log"  # the user_properties name a line travels under


@pytest.fixture
def ci_log(request) -> Callable[[str], None]:
    def write(line: str) -> None:
        request.node.user_properties.append((CI_LOG, line))

    return write


class _Printer:
    """Prints the tests' lines in the process that writes the log: the only process of a
    run without xdist, the main one of a run with it."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        # The teardown report carries every line of the test's setup and call.
        if report.when != "teardown":
            return
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        lines = [line for name, line in report.user_properties if name == CI_LOG]
        if not lines or reporter is None:
            return
        if self.config.pluginmanager.has_plugin("dsession"):
            # xdist's progress dots leave the line open, and write_line does not see them.
            reporter.write("\n")
        for line in lines:
            reporter.write_line(line)


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # an xdist worker's reports go to the main process
        config.pluginmanager.register(_Printer(config), "ci-log-printer")
