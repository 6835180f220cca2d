"""Both command lines, their output piped into a reader that has already gone (`| head`):
no traceback, and a closed pipe's exit status."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from common.pipes import CLOSED_PIPE_EXIT

REPO_ROOT = Path(__file__).resolve().parents[2]
# One process per way output leaves each command line: argparse's help (top level and a
# command's, which ends in SystemExit), a command's printed text and a table; the closed-pipe
# handling wraps each entry point's main (common/pipes.py), not each command.
INFRA = [
    ["-m", "infra", "--help"],
    ["-m", "infra", "down", "--help"],
    ["-m", "infra", "offers"],
    ["-m", "infra", "plan", "a100x8"],
    ["-m", "infra", "prices"],
]
TRAINING = [
    ["-m", "training", "--help"],
    ["-m", "training", "--print-ds-config"],
    ["-m", "training", "estimate"],
]
# Output that reaches the pipe before the process ends: the status a shell reports for a
# process ended by SIGPIPE, as `head` users expect (the others may also end 0).
SIGPIPE_STATUS = {("-m", "infra", "offers"), ("-m", "training", "estimate")}


def _into_a_closed_pipe(args: list[str]) -> subprocess.CompletedProcess:
    process = subprocess.Popen(
        [sys.executable, *args], cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    process.stdout.close()  # the reader is gone before the first line
    stderr = process.stderr.read().decode()
    return subprocess.CompletedProcess(args, process.wait(timeout=120), "", stderr)


@pytest.mark.parametrize("args", INFRA + TRAINING, ids=" ".join)
def test_output_into_a_closed_pipe_ends_quietly(args):
    result = _into_a_closed_pipe(args)
    assert "Traceback" not in result.stderr and "BrokenPipe" not in result.stderr, result.stderr
    if tuple(args) in SIGPIPE_STATUS:
        assert result.returncode == CLOSED_PIPE_EXIT == 141, result.stderr
    else:
        assert result.returncode in (0, CLOSED_PIPE_EXIT), result.stderr
