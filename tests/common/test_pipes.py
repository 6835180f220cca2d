"""Both command lines, their output piped into a reader that has already gone (`| head`):
no traceback, and a closed pipe's exit status."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
# Exit statuses: a process whose output reaches the pipe before it ends exits as a shell
# reports one ended by SIGPIPE, as `head` users expect; the others may also end 0.
SIGPIPE = (141,)  # 128 + SIGPIPE (13)
SIGPIPE_OR_DONE = (0, 141)
# One process per way output leaves each command line: argparse's help (top level and a
# command's, which ends in SystemExit), a command's printed text and a table; the closed-pipe
# handling wraps each entry point's main (common/pipes.py), not each command.
COMMANDS = [
    (["-m", "infra", "--help"], SIGPIPE_OR_DONE),
    (["-m", "infra", "down", "--help"], SIGPIPE_OR_DONE),
    (["-m", "infra", "offers"], SIGPIPE),
    (["-m", "infra", "plan", "a100x8"], SIGPIPE_OR_DONE),
    (["-m", "infra", "prices"], SIGPIPE_OR_DONE),
    (["-m", "training", "--help"], SIGPIPE_OR_DONE),
    (["-m", "training", "--print-ds-config"], SIGPIPE_OR_DONE),
    (["-m", "training", "estimate"], SIGPIPE),
]


def _into_a_closed_pipe(args: list[str]) -> subprocess.CompletedProcess:
    process = subprocess.Popen(
        [sys.executable, *args], cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    process.stdout.close()  # the reader is gone before the first line
    stderr = process.stderr.read().decode()
    return subprocess.CompletedProcess(args, process.wait(timeout=120), "", stderr)


@pytest.mark.parametrize(
    ("args", "statuses"), COMMANDS, ids=[" ".join(args) for args, _ in COMMANDS]
)
def test_output_into_a_closed_pipe_ends_quietly(args, statuses):
    result = _into_a_closed_pipe(args)
    assert "Traceback" not in result.stderr and "BrokenPipe" not in result.stderr, result.stderr
    assert result.returncode in statuses, result.stderr
