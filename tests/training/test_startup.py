"""training/startup.py in the two entry points: the launcher (`python -m training`) and a rank
(`python -m training.worker`)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.training.multirank import REPO_ROOT, launch_env

# Runs an entry point as `python -m` would, with --help (which parses the arguments after
# every import), and says at exit what the collector holds.
PROBE = """
import atexit, gc, runpy, sys
atexit.register(lambda: print("frozen", gc.get_freeze_count(), gc.isenabled()))
sys.argv = [sys.argv[1], "--help"]
runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
"""


@pytest.mark.multiprocess
@pytest.mark.parametrize("module", ["training", "training.worker"])
def test_the_imports_are_set_aside_from_the_collector_and_collection_runs_after(module):
    done = subprocess.run(
        [sys.executable, "-c", PROBE, module],
        cwd=REPO_ROOT,
        env=launch_env(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    _, frozen, enabled = done.stdout.splitlines()[-1].split()
    # torch alone makes well over 100,000 objects that the collector tracks.
    assert int(frozen) > 100_000 and enabled == "True", done.stdout[-500:]
