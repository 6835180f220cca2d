"""images/entrypoint.sh, run as the image runs it (after tini) with a stand-in `python` that
records its arguments: options alone become `python -m training OPTIONS`, any command runs
as given."""

from __future__ import annotations

import os
import subprocess

import pytest

from images.build_args import DOCKERFILE

SCRIPT = DOCKERFILE.with_name("entrypoint.sh")
RECORD_ARGV = """#!/bin/sh
for arg in "$@"; do printf '%s\\n' "$arg"; done
"""


@pytest.fixture
def run_entrypoint(tmp_path):
    """Runs the script with `python` and `bash` stand-ins on PATH; returns (program, argv)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("python", "bash"):
        stand_in = bin_dir / name
        stand_in.write_text(RECORD_ARGV.replace("for arg", f"echo {name}; for arg"))
        stand_in.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin"}

    def run(*args: str) -> list[str]:
        done = subprocess.run(
            ["sh", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=10
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.splitlines()

    return run


def test_options_alone_start_the_trainer(run_entrypoint):
    assert run_entrypoint("--config", "job.toml", "--set", "train.steps=2") == [
        "python",
        "-m",
        "training",
        "--config",
        "job.toml",
        "--set",
        "train.steps=2",
    ]
    assert run_entrypoint("-h") == ["python", "-m", "training", "-h"]


def test_a_command_runs_as_given(run_entrypoint):
    assert run_entrypoint("python", "-m", "training", "--config", "a b.toml") == [
        "python",
        "-m",
        "training",
        "--config",
        "a b.toml",
    ]
    assert run_entrypoint("bash", "-c", "echo '-x'") == ["bash", "-c", "echo '-x'"]


def test_the_command_replaces_the_shell():
    # exec: tini's SIGTERM goes to the trainer itself, not to a shell waiting on it.
    done = subprocess.run(
        ["sh", str(SCRIPT), "sh", "-c", 'echo "$$ $PPID"'],
        capture_output=True,
        text=True,
        timeout=10,
    )
    _, parent = done.stdout.split()
    assert parent == str(os.getpid())
    assert SCRIPT.stat().st_mode & 0o111  # COPY --chmod sets it in the image; git keeps it too
