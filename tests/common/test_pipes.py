"""Both command lines, their output piped into a reader that has already gone (`| head`):
no traceback, and a closed pipe's exit status."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from common.pipes import CLOSED_PIPE_EXIT
from infra.cli import COMMANDS

REPO_ROOT = Path(__file__).resolve().parents[2]
INFRA = [["-m", "infra", name, "--help"] for name in COMMANDS] + [
    ["-m", "infra", "offers"],
    ["-m", "infra", "plan", "a100x8"],
    ["-m", "infra", "prices"],
]
TRAINING = [
    ["-m", "training", "--help"],
    ["-m", "training", "--print-ds-config"],
    ["-m", "training", "estimate"],
    ["-m", "training", "export", "--help"],
]


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
    assert result.returncode in (0, CLOSED_PIPE_EXIT), result.stderr


@pytest.mark.parametrize("args", [["-m", "infra", "offers"], ["-m", "training", "estimate"]])
def test_a_closed_pipe_exits_as_a_shell_reports_sigpipe(args):
    assert _into_a_closed_pipe(args).returncode == CLOSED_PIPE_EXIT == 141
