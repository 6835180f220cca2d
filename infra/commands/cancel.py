"""`cancel STACK JOB`: stop a job with a final checkpoint; it leaves the queue.

The stack's target (infra/targets/) sends the job SIGTERM (it checkpoints and exits 75),
waits for the stop and prints the step and checkpoint the job reported. `run` with the same name
later resumes from that checkpoint.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from infra import targets
from infra.deployed import workspace
from infra.jobs import spool


def add_arguments(parser: argparse.ArgumentParser) -> None:
    workspace.add_stack_argument(parser)
    parser.add_argument("job", help="the job's name, as `jobs` lists it")


def run(
    args: argparse.Namespace,
    *,
    sleep: Callable[[float], None] = time.sleep,
    now: Callable[[], float] = time.monotonic,
) -> str:
    """Stop a job with a final checkpoint; it leaves the queue (`run` again resumes it)."""
    name = spool.check_name(args.job)
    return targets.target(workspace.stack_name(args)).cancel(name, sleep=sleep, now=now)
