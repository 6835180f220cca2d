"""A mistake in the machine's setup ends a command in one line with its fix and exit 2:
a Pulumi CLI that is not logged in (a stand-in on PATH that answers as the real one does),
a misspelt AWS_PROFILE, no network (a closed port as AWS's endpoint), an empty stack name.
In process, through infra.cli.main, as a user's command runs."""

from __future__ import annotations

import errno
import stat

import pytest

from common.setup_errors import explain
from infra.cli import main

# The real CLI's words without a backend (pulumi/pulumi#13293); `version` answers first,
# as the Automation API asks it before anything else.
NOT_LOGGED_IN = """#!/bin/sh
if [ "$1" = version ]; then echo v3.200.0; exit 0; fi
echo "error: PULUMI_ACCESS_TOKEN must be set for login during non-interactive CLI sessions" >&2
exit 255
"""


def one_error_line(capsys) -> str:
    out, err = capsys.readouterr()
    assert out == "" and "Traceback" not in err
    assert err.count("\n") == 1 and err.startswith("error: "), err
    return err


@pytest.fixture
def pulumi_not_logged_in(tmp_path, monkeypatch):
    cli = tmp_path / "bin" / "pulumi"
    cli.parent.mkdir()
    cli.write_text(NOT_LOGGED_IN)
    cli.chmod(cli.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{cli.parent}:/usr/bin:/bin")


@pytest.mark.parametrize(
    "argv",
    [
        ["jobs", "a100x8"],
        ["status", "a100x8"],
        ["logs", "a100x8"],
        ["down", "a100x8", "--yes"],
        ["run", "a100x8", "--config", "training/demo.toml"],
    ],
)
def test_pulumi_not_logged_in_is_one_line_naming_pulumi_login(pulumi_not_logged_in, capsys, argv):
    assert main(argv) == 2
    line = one_error_line(capsys)
    assert "not logged in" in line and "`pulumi login`" in line and "--local" in line


def test_a_misspelt_aws_profile_is_a_failed_check_not_a_crash(monkeypatch, capsys):
    monkeypatch.setenv("AWS_PROFILE", "prodd")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent/config")
    assert main(["doctor", "l4x1"]) == 1
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    aws = next(line for line in out.splitlines() if line.startswith("FAIL  aws"))
    assert "AWS profile 'prodd' (AWS_PROFILE) is not in ~/.aws/config" in aws
    assert "aws configure --profile prodd" in aws


def test_no_network_is_said_as_such(monkeypatch, capsys):
    # A port nothing listens on: the connection is refused at once, as without a network.
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    assert main(["prices", "--refresh"]) == 2
    line = one_error_line(capsys)
    assert "no network: cannot reach http://127.0.0.1:9" in line and "connection" in line


@pytest.mark.parametrize(
    ("error", "words"),
    [
        (OSError(errno.ENOSPC, "No space left on device", "/data/runs/x"), "no space left"),
        (PermissionError(errno.EACCES, "Permission denied", "/home/me/.pulumi"), "set HOME"),
        (OSError(errno.EROFS, "Read-only file system", "/ro/runs"), "cannot write /ro/runs"),
    ],
)
def test_a_full_or_unwritable_disk_is_one_sentence_with_the_fix(error, words):
    line = explain(error)
    assert line is not None and "\n" not in line and words in line
    assert error.filename in line


def test_anything_else_stays_a_bug_with_its_traceback():
    assert explain(ValueError("a bug")) is None
    assert explain(OSError(errno.EBADF, "Bad file descriptor")) is None
