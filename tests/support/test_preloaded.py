"""run_module: `python -m MODULE` as a process of its own, as a user's shell starts it."""

from __future__ import annotations

import os

from tests.support.preloaded import run_module

PROBE = """\
import os, sys
print(os.getpid(), os.getcwd(), os.environ.get("PROBE"), len(os.environ), *sys.argv[1:])
print("said on stderr", file=sys.stderr)
sys.exit(int(sys.argv[1]))
"""


def test_a_module_runs_in_its_own_process_with_its_arguments_environment_and_folder(tmp_path):
    # A package found only in the working folder, as `python -m` finds one.
    (tmp_path / "probe").mkdir()
    (tmp_path / "probe" / "__init__.py").write_text("")
    (tmp_path / "probe" / "__main__.py").write_text(PROBE)

    result = run_module("probe", ["3", "two words"], env={"PROBE": "given"}, cwd=tmp_path)

    assert result.returncode == 3
    assert result.stderr == "said on stderr\n"
    pid, folder, probe, variables, *args = result.stdout.split()
    assert int(pid) != os.getpid()
    assert (folder, probe, variables, args) == (str(tmp_path), "given", "1", ["3", "two", "words"])


def test_an_uncaught_exception_exits_1_with_its_traceback(tmp_path):
    (tmp_path / "broken.py").write_text("raise RuntimeError('no such luck')\n")
    result = run_module("broken", [], env={}, cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr.rstrip().endswith("RuntimeError: no such luck")
    assert "Traceback (most recent call last)" in result.stderr
