"""The suite's time, kept visible and bounded.

- Every test has a time limit (`test_time_limit`, seconds of setup and call together):
  one that runs past it fails, unless it is marked `slow(reason=..., seconds=N)`, which
  says what the time buys and the most it may take on a 2-core machine.
- The marked-slow set has a stated total (`slow_time_budget`): tests/test_suite_time.py
  fails when the declared seconds add up past it, so a new long story has to make room.
- The longest work is handed out first, so the run ends when its longest story does.
- Tests that share one piece of machinery run on one xdist worker (`--dist loadgroup`):
  a loopback Slurm cluster, the image build, and a module's tests that read one
  module-scoped fixture (built once, not once per worker that runs one of them).
- The Slurm stories are split, a module at a time, over `slurm_clusters` groups of about
  equal slow-mark time: each group's worker starts a cluster of its own, so independent
  stories run at the same time instead of one after another on one worker.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

SLOW_MARKS = pytest.StashKey[dict[str, float]]()
_SETUP_S = pytest.StashKey[float]()
_MARK_ERROR = pytest.StashKey[str]()
_ALLOWED_S = pytest.StashKey[float]()
# Tests that use these fixtures (directly or through another fixture) reach a Slurm cluster,
# which a worker starts once: they run in the Slurm groups (`_slurm_groups`).
_SLURM_FIXTURES = ("slurm", "slurm_session")
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
        "slurm_clusters",
        "how many loopback Slurm clusters (one per xdist worker) the Slurm stories share",
        default="1",
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
        if _uses_slurm(item):
            item.add_marker(pytest.mark.slurm)
        for mark, group in _GROUP_OF_MARK.items():
            if item.get_closest_marker(mark) is not None:
                item.add_marker(pytest.mark.xdist_group(group))
    limit = time_limit(config)
    groups = _slurm_groups(items, int(config.getini("slurm_clusters")), limit)
    for item in items:
        if _uses_slurm(item):
            item.add_marker(pytest.mark.xdist_group(groups[_module(item)]))
        elif item.get_closest_marker("xdist_group") is None and _shares_a_module_fixture(item):
            # Its module's tests together: the fixture is built once, not once per worker.
            item.add_marker(pytest.mark.xdist_group(_module(item)))
    _longest_first(items, limit)
    config.stash[SLOW_MARKS] = slow
    if config.getoption("slow_marks_json"):
        Path(config.getoption("slow_marks_json")).write_text(json.dumps(slow))


def _uses_slurm(item: pytest.Item) -> bool:
    """The test reaches a Slurm cluster (through the `slurm` fixture or a fixture of its own
    built on the session's cluster)."""
    return any(fixture in getattr(item, "fixturenames", ()) for fixture in _SLURM_FIXTURES)


def _slurm_groups(items: list[pytest.Item], clusters: int, limit: float) -> dict[str, str]:
    """Module -> its Slurm group ("slurm-1", ...): the modules, longest first, each to the
    group with the least work so far. A module stays whole: its module fixtures (the
    reference run) are built on the cluster its tests use."""
    cost: dict[str, float] = {}
    for item in items:
        if _uses_slurm(item):
            module = _module(item)
            cost[module] = cost.get(module, 0.0) + _allowed(item, limit)
    load = {f"slurm-{n}": 0.0 for n in range(1, max(clusters, 1) + 1)}
    groups = {}
    for module in sorted(cost, key=lambda module: (-cost[module], module)):
        group = min(load, key=lambda name: (load[name], name))
        groups[module], load[group] = group, load[group] + cost[module]
    return groups


def _module(item: pytest.Item) -> str:
    return item.nodeid.split("::")[0]


def _allowed(item: pytest.Item, limit: float) -> float:
    """What the test may take: its slow mark's seconds, or a tenth of the limit (most tests
    not marked slow take a fraction of it)."""
    return item.stash.get(_ALLOWED_S, limit / 10)


def _longest_first(items: list[pytest.Item], limit: float) -> None:
    """Order the work longest first, each xdist group as one piece (what its tests may take
    together; a test not marked slow counts a tenth of the limit). xdist hands the pieces out
    in this order (with --no-loadscope-reorder), so no long story starts last, alone."""
    cost: dict[str, float] = {}
    for item in items:
        unit = _work_unit(item)
        cost[unit] = cost.get(unit, 0.0) + _allowed(item, limit)
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
