"""Command line for a stack's whole life: `python -m infra COMMAND ...`.

offers -> plan -> up -> run / jobs / logs / cancel / status -> stop / start -> down; doctor first.
Installed (`pip install ".[infra]"`), the same commands are the `gpu-stack` script, which
also runs the trainer's: `gpu-stack train|estimate|export ...` (with the `train` extra).

Each command registers itself in `COMMANDS` (name -> (add_arguments, run)); a new
command adds one entry; the first line of its `run` docstring (else of its module's)
is its `--help` line.
`run` returns the text to print, or an Outcome (text, exit status).
Bad input, and a setup mistake (common/setup_errors.py), end in a one-line error and exit 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from common.pipes import run_until_pipe_closes
from common.setup_errors import explain
from images.matrix import MatrixError
from infra.commands import (
    cancel,
    doctor,
    down,
    jobs,
    logs,
    offers,
    plan,
    prices,
    start,
    status,
    stop,
    up,
)
from infra.commands import run as run_job
from infra.commands.outcome import Outcome
from infra.errors import ConfigError

EXIT_BAD_INPUT = 2


class _OneLineParser(argparse.ArgumentParser):
    """argparse that reports a usage error in one line (and exit 2), like every other error."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise ConfigError(f"{self.prog}: {message}")


Command = tuple[
    Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], str | Outcome]
]

# In the order of a stack's life.
COMMANDS: dict[str, Command] = {
    "offers": (offers.add_arguments, offers.run),
    "doctor": (doctor.add_arguments, doctor.run),
    "plan": (plan.add_arguments, plan.run),
    "prices": (prices.add_arguments, prices.run),
    "preview": (up.add_preview_arguments, up.run_preview),
    "up": (up.add_arguments, up.run),
    "run": (run_job.add_arguments, run_job.run),
    "jobs": (jobs.add_arguments, jobs.run),
    "cancel": (cancel.add_arguments, cancel.run),
    "status": (status.add_arguments, status.run),
    "logs": (logs.add_arguments, logs.run),
    "stop": (stop.add_arguments, stop.run),
    "start": (start.add_arguments, start.run),
    "down": (down.add_arguments, down.run),
}


# The trainer's commands (training/cli.py), run as `python -m training` runs them; imported
# only when used, so the stack's commands work where torch is not installed.
TRAINING_COMMANDS = {
    "train": "Train with DeepSpeed on this machine (python -m training)",
    "estimate": "GPU memory a job needs per GPU, before renting (python -m training estimate)",
    "export": "A checkpoint's weights as a plain fp32 state dict (python -m training export)",
}
CONSOLE_SCRIPT = "gpu-stack"  # pyproject.toml [project.scripts]


def _run_training(argv: list[str]) -> int:
    from training import startup

    startup.listen()  # before the trainer's imports, as training/__main__.py does
    from training.cli import main as training_main

    return training_main(argv)


def _summary(run: Callable) -> str | None:
    """The `--help` line: the first line of `run`'s docstring, else of its module's."""
    text = run.__doc__ or getattr(sys.modules.get(run.__module__), "__doc__", None) or ""
    lines = text.strip().splitlines()
    return lines[0] if lines else None


def _refuse_empty_names(args: argparse.Namespace) -> None:
    """`plan ''` names no stack: refused, not read as the default one."""
    for positional in ("stack", "profile"):
        if getattr(args, positional, None) == "":
            raise ConfigError(
                f"{positional} name is '' (empty): give one (see `python -m infra offers`), "
                "or leave it out for the default"
            )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] and argv[0] in TRAINING_COMMANDS:
        return _run_training(argv[1:] if argv[0] == "train" else argv)
    installed = Path(sys.argv[0]).name == CONSOLE_SCRIPT
    parser = _OneLineParser(
        prog=CONSOLE_SCRIPT if installed else "python -m infra",
        description=__doc__.splitlines()[0],
        epilog=__doc__.splitlines()[2],
    )
    commands = parser.add_subparsers(
        dest="command", required=True, parser_class=_OneLineParser, metavar="COMMAND"
    )
    for name, (add_arguments, run) in COMMANDS.items():
        help_line = _summary(run)
        add_arguments(commands.add_parser(name, help=help_line, description=help_line))
    for name, help_line in TRAINING_COMMANDS.items():
        commands.add_parser(name, help=help_line, add_help=False)
    # `run STACK ... -- COMMAND`: what follows `--` is the job's command, not run's options.
    argv, job_command = (
        (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, None)
    )
    try:
        args = parser.parse_args(argv)
        _refuse_empty_names(args)
        if args.command == "run":
            args.job_command = job_command
        elif job_command is not None:
            raise ConfigError(f"{args.command} takes no `-- COMMAND` (only `run` does)")
        output = COMMANDS[args.command][1](args)
    except (ConfigError, MatrixError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("interrupted: nothing more was changed", file=sys.stderr)
        return 130
    except Exception as exc:  # a setup mistake (not logged in, no network, ...): one line
        line = explain(exc)
        if line is None:
            raise
        print(f"error: {line}", file=sys.stderr)
        return EXIT_BAD_INPUT
    text, code = output if isinstance(output, Outcome) else (output, 0)
    if text:
        print(text)
    return code


def run() -> int:
    """`python -m infra` and the `gpu-stack` script: main(), quiet when `| head` closes early."""
    return run_until_pipe_closes(main)
