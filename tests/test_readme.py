"""README's command blocks, as a newcomer copies them: every file they name exists, every
`python -m infra` command parses with the real command line (the offline ones run, and
`run`'s checks of its job and --code run against the a100x8 stack file), and the trainer's
commands that need no training run for real."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from infra import cli
from infra.commands import run as run_job
from infra.jobs.code_check import check_code
from infra.knowledge.profiles import load_profiles
from infra.outputs import LOCAL
from training.spec.config import load_config

REPO = Path(__file__).resolve().parents[1]
# Commands that need nothing but the repository: run for real.
OFFLINE = ("offers", "plan")


def readme_commands() -> list[list[str]]:
    """Each command line of README's ```bash blocks, continuations joined, comments cut."""
    text = (REPO / "README.md").read_text()
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("  #")[0].strip()
            if line and not line.startswith("#") and "$" not in line:
                commands.append(shlex.split(line))
    return commands


def named_files(command: list[str]) -> list[str]:
    """The repository files a command names (a config, a folder to ship, a script)."""
    return [
        word
        for word in command
        if re.fullmatch(r"(examples|jobs|bench|training|infra|images)/[\w./-]*", word)
        or re.fullmatch(r"Pulumi\.[\w.-]+\.yaml", word)
    ]


COMMANDS = readme_commands()
STACK = [c[3:] for c in COMMANDS if c[:3] == ["python", "-m", "infra"]]


def test_the_readme_has_the_commands_this_test_reads():
    assert len(STACK) >= 10 and any(c[:3] == ["python", "-m", "training"] for c in COMMANDS)


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_every_file_a_readme_command_names_exists(command):
    for name in named_files(command):
        assert (REPO / name).exists(), f"README names {name}, which does not exist"
    if command[:2] == ["python", "-m"] and command[2] not in ("infra", "training"):
        assert (REPO / command[2] / "__main__.py").is_file()


@pytest.mark.parametrize("argv", STACK, ids=" ".join)
def test_every_readme_stack_command_parses_and_the_offline_ones_run(argv, monkeypatch, capsys):
    name = argv[0]
    if name not in OFFLINE or "--resources" in argv:  # needs AWS or Pulumi: parsed only
        add_arguments, _ = cli.COMMANDS[name]
        monkeypatch.setitem(cli.COMMANDS, name, (add_arguments, lambda args: ""))
    assert cli.main(argv) == 0, capsys.readouterr().err
    stacks = (*load_profiles().profiles, LOCAL)
    assert argv[1:2] == [] or argv[1].startswith("-") or argv[1] in stacks


def test_the_readme_job_and_its_code_pass_runs_checks():
    argv = next(c for c in STACK if c[0] == "run" and "--code" in c)
    config, code = Path(argv[argv.index("--config") + 1]), Path(argv[argv.index("--code") + 1])
    overrides = [argv[i + 1] for i, word in enumerate(argv) if word == "--set"]
    plan = run_job.check_job(argv[1], REPO / config, overrides)
    check_code(REPO / code, load_config(REPO / config, overrides), plan.variant)


@pytest.mark.parametrize(
    "argv",
    [c[3:] for c in COMMANDS if c[:4] == ["python", "-m", "training", "estimate"]]
    + [c[3:] for c in COMMANDS if "--print-ds-config" in c],
    ids=" ".join,
)
def test_the_readme_trainer_commands_that_train_nothing_run(argv, monkeypatch, capsys):
    from training.cli import main

    monkeypatch.chdir(REPO)
    assert main(argv) == 0, capsys.readouterr().err
