"""`status [STACK]`: each node's state, the job's progress, the last checkpoint and the spend.

Nodes from EC2 (read through their spot requests: interrupted, waiting for capacity),
the job from the status.json the trainer keeps beside its checkpoints, spend and
budget from the spend guard's ledger (infra/functions/ledger.py: read_ledger).
The stack's target (infra/targets/) writes it: a Slurm cluster's shows its instances by
tag and its queue, with each queued job's progress and checkpoint.
"""

from __future__ import annotations

import argparse
import datetime
import math
import sys
import time
from collections.abc import Callable

from infra import targets
from infra.deployed import workspace
from infra.errors import ConfigError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    workspace.add_stack_argument(parser)
    parser.add_argument(
        "--watch",
        type=float,
        metavar="SECONDS",
        help="print it again every SECONDS until Ctrl-C (waiting for capacity, an image push)",
    )


def run(
    args: argparse.Namespace,
    *,
    now: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(datetime.UTC),
    out=None,
    sleep: Callable[[float], None] = time.sleep,
) -> str:
    """Per node (or Slurm queue): state; each job's step, loss, rate, time left; spend."""
    watch = args.watch
    if watch is not None and not (math.isfinite(watch) and watch > 0):  # NaN: no comparison
        raise ConfigError(f"--watch {watch:g}: give seconds above 0")
    target = targets.target(workspace.stack_name(args))
    if watch is None:
        return target.report(now())
    out = out or sys.stdout
    try:
        while True:
            out.write(f"{target.report(now())}\n\n")
            out.flush()
            sleep(watch)
    except KeyboardInterrupt:
        return ""
