"""The command line's structure: every command in --help, offline commands import no Pulumi."""

import subprocess
import sys
from pathlib import Path

import pytest

from infra.cli import COMMANDS
from tests.support.infra import run_cli

REPO = Path(__file__).resolve().parents[2]
LIFE_CYCLE = (
    "offers", "plan", "up", "preview", "status", "logs", "stop", "start", "down", "doctor",
    "run", "jobs", "cancel",
)  # fmt: skip


def test_help_lists_every_command_of_the_life_cycle_with_its_line():
    result = run_cli("--help")
    assert result.returncode == 0, result.stderr
    listed = {line.split()[0] for line in result.stdout.splitlines() if line.startswith("    ")}
    assert set(LIFE_CYCLE) <= listed
    for name in LIFE_CYCLE:
        summary = COMMANDS[name][1].__doc__.strip().splitlines()[0]
        assert summary.split()[0] in result.stdout


@pytest.mark.parametrize("argv", [["plan"], ["plan", "l4x1"], ["offers", "--gpu", "A100"]])
def test_offline_commands_import_neither_pulumi_nor_boto3(argv):
    code = (
        "import sys, contextlib, io\n"
        "from infra.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    assert main({argv!r}) == 0\n"
        "loaded = sorted(m for m in ('pulumi', 'boto3', 'infra.dryrun.run') if m in sys.modules)\n"
        "print(loaded)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_a_command_registered_by_one_entry_runs(monkeypatch, capsys):
    from infra import cli

    def add(parser):
        parser.add_argument("--n", type=int, default=1)

    def run(args):
        """Say hello n times."""
        return "hello " * args.n

    monkeypatch.setitem(cli.COMMANDS, "hello", (add, run))
    assert cli.main(["hello", "--n", "2"]) == 0
    assert capsys.readouterr().out == "hello hello \n"
