"""The suite's time, kept visible and bounded.

- Every test has a time limit (`test_time_limit`, seconds of setup and call together):
  one that runs past it fails, unless it is marked `slow(reason=..., seconds=N)`, which
  says what the time buys and the most it may take on a 2-core machine.
- The marked-slow set has a stated total (`slow_time_budget`): tests/test_suite_time.py
  fails when the declared seconds add up past it, so a new long story has to make room.
- The longest work is handed out first, so the run ends when its longest story does.
- Tests that share one piece of machinery run on one xdist worker (`--dist loadgroup`):
  the loopback Slurm cluster, the image build, and a module's tests that read one
  module-scoped fixture (built once, not once per worker that runs one of them).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

SLOW_MARKS = pytest.StashKey[dict[str, float]]()
_SETUP_S = pytest.StashKey[float]()
_MARK_ERROR = pytest.StashKey[str]()
_ALLOWED_S = pytest.StashKey[float]()
# Tests that use these fixtures (directly or through another fixture) share one cluster per
# worker: keep them on one worker, so that a run starts one cluster.
_GROUP_OF_FIXTURE = {"slurm": "slurm", "slurm_session": "slurm"}
_GROUP_OF_MARK = {"image": "image"}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--slow-marks-json",
        metavar="PATH",
        help="write every collected test's slow seconds to PATH (a JSON object)",
    )
    parser.addini(
        "test_time_limit",
        "seconds a test may take (setup and call) unless it is marked slow",
        default="20",
    )
    parser.addini(
        "slow_time_budget",
        "seconds that the slow marks' declared times may add up to",
        default="0",
    )


class BadSlowMark(ValueError):
    """A slow mark that does not say why and for how long."""


def slow_seconds(item: pytest.Item) -> float | None:
    """The seconds a slow mark allows the test, None if it is not marked slow.

    A slow mark without a reason or a positive number of seconds is a BadSlowMark.
    """
    mark = item.get_closest_marker("slow")
    if mark is None:
        return None
    reason, seconds = mark.kwargs.get("reason"), mark.kwargs.get("seconds")
    if mark.args or not isinstance(reason, str) or not reason.strip():
        raise BadSlowMark(f"{item.nodeid}: mark it slow(reason='what the time buys', seconds=N)")
    if not isinstance(seconds, int | float) or seconds <= 0:
        raise BadSlowMark(
            f"{item.nodeid}: slow(seconds=...) must be the most it may take, in seconds"
        )
    return float(seconds)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Before any deselection: note every slow mark, and add the markers that follow from
    what a test uses (`slurm` from the fixture, the xdist group that keeps it on one worker)."""
    slow: dict[str, float] = {}
    for item in items:
        try:
            seconds = slow_seconds(item)
        except BadSlowMark as error:
            # The test fails with this line. A usage error here would crash an xdist worker.
            item.stash[_MARK_ERROR] = str(error)
            continue
        if seconds is not None:
            slow[item.nodeid] = seconds
            # On the item, not by node id: --dist loadgroup appends "@group" to the id later.
            item.stash[_ALLOWED_S] = seconds
            # Room for a hang to be told from a slow run: pytest-timeout's own limit.
            if item.get_closest_marker("timeout") is None:
                item.add_marker(pytest.mark.timeout(max(600, 3 * seconds)))
        fixtures = getattr(item, "fixturenames", ())
        for group in {group for fixture, group in _GROUP_OF_FIXTURE.items() if fixture in fixtures}:
            item.add_marker(getattr(pytest.mark, group))
            item.add_marker(pytest.mark.xdist_group(group))
        for mark, group in _GROUP_OF_MARK.items():
            if item.get_closest_marker(mark) is not None:
                item.add_marker(pytest.mark.xdist_group(group))
        if item.get_closest_marker("xdist_group") is None and _shares_a_module_fixture(item):
            # Its module's tests together: the fixture is built once, not once per worker.
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
    _longest_first(items, time_limit(config))
    config.stash[SLOW_MARKS] = slow
    if config.getoption("slow_marks_json"):
        Path(config.getoption("slow_marks_json")).write_text(json.dumps(slow))


def _longest_first(items: list[pytest.Item], limit: float) -> None:
    """Order the work longest first, each xdist group as one piece (what its tests may take
    together; a test not marked slow counts a tenth of the limit). xdist hands the pieces out
    in this order (with --no-loadscope-reorder), so no long story starts last, alone."""
    cost: dict[str, float] = {}
    for item in items:
        unit = _work_unit(item)
        cost[unit] = cost.get(unit, 0.0) + item.stash.get(_ALLOWED_S, limit / 10)
    items.sort(key=lambda item: -cost[_work_unit(item)])


def _work_unit(item: pytest.Item) -> str:
    mark = item.get_closest_marker("xdist_group")
    if mark is None:
        return item.nodeid
    return str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))


def _shares_a_module_fixture(item: pytest.Item) -> bool:
    """The test uses a module-scoped fixture (a training run several tests read, say)."""
    info = getattr(item, "_fixtureinfo", None)
    definitions = info.name2fixturedefs.values() if info is not None else ()
    return any(defs and defs[-1].scope == "module" for defs in definitions)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    if _MARK_ERROR in item.stash:
        pytest.fail(item.stash[_MARK_ERROR], pytrace=False)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report: pytest.TestReport = yield
    if report.when == "setup":
        item.stash[_SETUP_S] = report.duration
    elif report.when == "call" and report.passed:
        took = item.stash.get(_SETUP_S, 0.0) + report.duration
        allowed = item.stash.get(_ALLOWED_S, None)
        limit = allowed if allowed is not None else time_limit(item.config)
        if took > limit:
            report.outcome = "failed"
            how = (
                f"its slow mark allows {limit:g} s"
                if allowed is not None
                else f"the limit is {limit:g} s: make it shorter, or mark it "
                "slow(reason='what the time buys', seconds=N)"
            )
            report.longrepr = f"{item.nodeid} took {took:.1f} s; {how}"
    return report


def time_limit(config: pytest.Config) -> float:
    return float(config.getini("test_time_limit"))


def slow_budget(config: pytest.Config) -> float:
    return float(config.getini("slow_time_budget"))
