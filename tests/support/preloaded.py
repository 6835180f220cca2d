"""`python -m MODULE ARGS` as a process forked from one that has already imported the
project's command lines, for the many tests that run one only to read what it refuses or
prints.

Each call is a new process with its own arguments, environment, working folder, output and
exit status, as a user's run is; what it skips is the interpreter's start and the seconds of
imports (torch, DeepSpeed, pulumi-aws), paid once per test worker in multiprocessing's fork
server, which imports them before any thread starts (docs.python.org/3/library/
multiprocessing.html#contexts-and-start-methods). Tests of what only a fresh interpreter
shows (signals, pipes, the installed script) start one with subprocess as before.
"""

from __future__ import annotations

import multiprocessing
import os
import runpy
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

# What `python -m training` imports before it reads its arguments, and what `python -m
# infra` imports to run the stack's program under Pulumi's mocks (plan, offers).
PRELOAD = [
    "training.cli",
    "infra.cli",
    "infra.dryrun.runner",
    "infra.components.cluster_stack",
    "infra.components.single_node",
]
REPO_ROOT = Path(__file__).resolve().parents[2]

_CONTEXT = multiprocessing.get_context("forkserver")
_CONTEXT.set_forkserver_preload(PRELOAD)


def run_module(
    module: str,
    args: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path = REPO_ROOT,
    timeout: float = 120,
) -> subprocess.CompletedProcess:
    """What `python -m module *args` run in `cwd` with `env` (default: this process's)
    exits with and writes, as subprocess.run(..., capture_output=True, text=True) gives it."""
    with tempfile.TemporaryDirectory() as folder:
        stdout, stderr = Path(folder) / "stdout", Path(folder) / "stderr"
        process = _CONTEXT.Process(
            target=_run_as_main,
            args=(module, list(args), dict(os.environ if env is None else env), str(cwd)),
            kwargs={"stdout": str(stdout), "stderr": str(stderr)},
        )
        process.start()
        process.join(timeout)
        if process.exitcode is None:
            process.kill()
            process.join()
            raise subprocess.TimeoutExpired([module, *args], timeout)
        return subprocess.CompletedProcess(
            ["python", "-m", module, *args],
            process.exitcode,
            stdout.read_text() if stdout.exists() else "",
            stderr.read_text() if stderr.exists() else "",
        )


def _run_as_main(
    module: str, args: list[str], env: dict[str, str], cwd: str, *, stdout: str, stderr: str
) -> None:
    """In the forked process: become `python -m module *args` (its SystemExit is the exit
    status multiprocessing gives the parent)."""
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    tempfile.tempdir = None  # read TMPDIR again, as a new interpreter would
    for fd, path in ((1, stdout), (2, stderr)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(target, fd)
        os.close(target)
    sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115 (the process's own stream)
    sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
    sys.argv = [module, *args]
    sys.path.insert(0, cwd)  # as `python -m` puts the working folder first
    runpy.run_module(module, run_name="__main__", alter_sys=True)
