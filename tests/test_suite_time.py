"""The suite's time limits (tests/support/suite_time.py) hold, and the slow set stays in budget."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.suite_time import SLOW_MARKS, slow_budget

pytest_plugins = ["pytester"]
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def suite(pytester, monkeypatch):
    """An inner test session with the plugin, a 0.5 s limit and a 5 s slow budget."""
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    # Only the plugins the inner session needs: loading every installed one takes seconds.
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    pytester.makeini(
        "[pytest]\ntest_time_limit = 0.5\nslow_time_budget = 5\n"
        "markers =\n    slow: long\n    slurm: cluster\n    image: build\n"
    )
    return pytester


def _run(pytester, source: str):
    pytester.makepyfile(test_inner=source)
    return pytester.runpytest_inprocess("-p", "tests.support.suite_time", "-p", "pytest_timeout")


def test_a_test_past_the_limit_fails_and_says_how_to_mend_it(suite):
    result = _run(
        suite,
        "import time\ndef test_quick():\n    pass\ndef test_long():\n    time.sleep(0.7)\n",
    )
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        ["*test_long took 0.* s; the limit is 0.5 s: make it shorter, or mark it slow(*"]
    )


def test_setup_time_counts_towards_the_limit(suite):
    result = _run(
        suite,
        "import time, pytest\n"
        "@pytest.fixture\ndef heavy():\n    time.sleep(0.35)\n"
        "def test_light_call(heavy):\n    time.sleep(0.25)\n",
    )
    result.assert_outcomes(failed=1)


def test_a_slow_mark_allows_its_seconds_and_no_more(suite):
    result = _run(
        suite,
        "import time, pytest\n"
        "@pytest.mark.slow(reason='a real story', seconds=1)\n"
        "def test_allowed():\n    time.sleep(0.7)\n"
        "@pytest.mark.slow(reason='a real story', seconds=0.6)\n"
        "def test_past_its_mark():\n    time.sleep(0.7)\n",
    )
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*test_past_its_mark took 0.* s; its slow mark allows 0.6 s*"])


def on_three_workers(suite):
    """The inner suite on three xdist workers, grouped as `make test` groups them."""
    return suite.runpytest_subprocess(
        "-p", "tests.support.suite_time", "-p", "xdist.plugin", "-n", "3", "--dist", "loadgroup"
    )


def workers_that_ran(folder: Path, tests: str) -> set[str]:
    """The workers named in the files "<test>-<worker>" that the tests matching `tests` left."""
    return {path.name.split("-")[1] for path in folder.glob(f"{tests}-gw*")}


def test_tests_using_the_cluster_share_one_worker_and_keep_their_slow_marks(suite, tmp_path):
    """--dist loadgroup: every test using the `slurm` fixture on one worker (one cluster, not
    one per worker), each with its slow mark's allowance though xdist renames it ("@slurm")."""
    suite.makeconftest(
        "import pytest\n@pytest.fixture(scope='session')\ndef slurm_session():\n    return 1\n"
        "@pytest.fixture\ndef slurm(slurm_session):\n    return 1\n"
        "@pytest.fixture(scope='module')\ndef reference(slurm_session):\n    return 1\n"
    )
    suite.makepyfile(
        # One test reaches the cluster through a module fixture only, as the reference run does.
        test_reference="import os, time, pytest\n"
        "@pytest.mark.slow(reason='a real story', seconds=5)\n"
        "def test_e(reference):\n    time.sleep(0.6)\n"
        f"    open(r'{tmp_path}/e-' + os.environ['PYTEST_XDIST_WORKER'], 'w')\n",
        test_inner="import os, time, pytest\n"
        + "".join(
            f"@pytest.mark.slow(reason='a real story', seconds=5)\n"
            f"def test_{n}(slurm):\n    time.sleep(0.6)\n"
            f"    open(r'{tmp_path}/{n}-' + os.environ['PYTEST_XDIST_WORKER'], 'w')\n"
            for n in "abcd"
        ),
    )
    result = on_three_workers(suite)
    result.assert_outcomes(passed=5)
    workers = workers_that_ran(tmp_path, "?")
    assert len(workers) == 1, workers


def test_slurm_stories_split_by_module_over_clusters_that_run_at_once(suite, tmp_path):
    """slurm_clusters = 2: the Slurm modules, balanced by slow-mark time (5 s against 2+2 s),
    go to two workers that run them at the same time; a module stays on one worker (its
    module fixture, the reference run, is built on that worker's cluster)."""
    suite.makeini(
        "[pytest]\ntest_time_limit = 0.5\nslow_time_budget = 50\nslurm_clusters = 2\n"
        "markers =\n    slow: long\n    slurm: cluster\n    image: build\n"
    )
    suite.makeconftest(
        "import pytest\n@pytest.fixture(scope='session')\ndef slurm_session():\n    return 1\n"
        "@pytest.fixture\ndef slurm(slurm_session):\n    return 1\n"
    )
    story = (
        "@pytest.mark.slow(reason='a real story', seconds={seconds})\n"
        "def test_{name}(slurm):\n    began = time.time()\n    time.sleep(0.5)\n"
        f"    path = r'{tmp_path}/{{name}}-' + os.environ['PYTEST_XDIST_WORKER']\n"
        "    open(path, 'w').write(f'{{began}} {{time.time()}}')\n"
    )
    head = "import os, time, pytest\n"
    suite.makepyfile(
        test_long=head + "".join(story.format(name=f"long{n}", seconds=2.5) for n in "ab"),
        test_short=head + story.format(name="shorta", seconds=2),
        test_other=head + story.format(name="othera", seconds=2),
    )
    result = on_three_workers(suite)
    result.assert_outcomes(passed=4)
    long, short, other = (workers_that_ran(tmp_path, f"{m}?") for m in ("long", "short", "other"))
    assert len(long) == 1 and short == other and long != short, (long, short, other)
    spans = {p.name: [float(t) for t in p.read_text().split()] for p in tmp_path.glob("*-gw*")}
    long_a = spans[f"longa-{min(long)}"]
    assert any(span[0] < long_a[1] and long_a[0] < span[1] for span in (
        spans[f"shorta-{min(short)}"], spans[f"othera-{min(other)}"]
    )), spans  # fmt: skip


def test_the_tests_of_a_module_fixture_share_one_worker(suite, tmp_path):
    """A module-scoped fixture is built once: its module's tests stay on one worker, while
    the tests of a module without one spread over the workers."""
    folder = f"r'{tmp_path}/'"
    record = f"    open({folder} + name + '-' + os.environ['PYTEST_XDIST_WORKER'], 'w')\n"
    suite.makepyfile(
        test_shared="import os, time, pytest\n"
        "@pytest.fixture(scope='module')\ndef run():\n    time.sleep(0.2)\n"
        + "".join(
            f"def test_{n}(run):\n    name = 'shared{n}'\n    time.sleep(0.2)\n{record}"
            for n in "abcdef"
        ),
        test_plain="import os, time\n"
        + "".join(
            f"def test_{n}():\n    name = 'plain{n}'\n    time.sleep(0.2)\n{record}"
            for n in "abcdef"
        ),
    )
    result = on_three_workers(suite)
    result.assert_outcomes(passed=12)
    shared = workers_that_ran(tmp_path, "shared?")
    plain = workers_that_ran(tmp_path, "plain?")
    assert len(shared) == 1, shared
    assert len(plain) > 1, plain


def test_the_longest_work_comes_first(suite):
    """A group's tests together, as xdist hands them out, then the slowest single tests."""
    suite.makeconftest("import pytest\n@pytest.fixture\ndef slurm():\n    return 1\n")
    slow = "@pytest.mark.slow(reason='a story', seconds={})\n"
    suite.makepyfile(
        test_inner="import pytest\n"
        "def test_quick():\n    pass\n"
        + slow.format(2)
        + "def test_long():\n    pass\n"
        + "".join(f"{slow.format(1.5)}def test_cluster_{n}(slurm):\n    pass\n" for n in "ab")
        + slow.format(1)
        + "def test_longer_than_quick():\n    pass\n"
    )
    result = suite.runpytest_inprocess("-p", "tests.support.suite_time", "--collect-only", "-q")
    names = [line.split("::")[-1] for line in result.outlines if "::" in line]
    assert names == [
        "test_cluster_a",
        "test_cluster_b",
        "test_long",
        "test_longer_than_quick",
        "test_quick",
    ]


@pytest.mark.parametrize(
    "mark",
    ["pytest.mark.slow", "pytest.mark.slow(seconds=3)", "pytest.mark.slow(reason='x')"],
)
def test_a_slow_mark_needs_a_reason_and_seconds(suite, mark):
    result = _run(suite, f"import pytest\n@{mark}\ndef test_it():\n    pass\n")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*test_it: *slow(*"])


def test_a_failing_test_keeps_its_own_failure(suite):
    result = _run(suite, "import time\ndef test_it():\n    time.sleep(0.7)\n    assert 1 == 2\n")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*assert 1 == 2*"])


def _slow_marks_of_the_whole_suite(config: pytest.Config, tmp_path: Path) -> dict[str, float]:
    """The slow marks this session collected, when it collected every test; else those of a
    collection of the whole suite in a subprocess (a run of this file alone)."""
    args = [Path(arg).resolve() for arg in config.args]
    if args in ([], [REPO], [REPO / "tests"]) and not config.option.keyword:
        return config.stash[SLOW_MARKS]
    out = tmp_path / "slow.json"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:randomly",
         "-p", "no:xdist", "-o", "addopts=", f"--slow-marks-json={out}", "tests"],
        cwd=REPO, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return json.loads(out.read_text())


def test_the_slow_set_stays_within_its_stated_budget(pytestconfig, tmp_path):
    slow = _slow_marks_of_the_whole_suite(pytestconfig, tmp_path)
    budget, total = slow_budget(pytestconfig), sum(slow.values())
    listing = "\n".join(f"{s:6.0f} s  {n}" for n, s in sorted(slow.items(), key=lambda x: -x[1]))
    assert total <= budget, (
        f"the slow marks add up to {total:.0f} s, past the budget of {budget:.0f} s "
        f"(pyproject.toml, slow_time_budget): make room before adding one\n{listing}"
    )
