"""`logs [STACK] [--node N | --job NAME] [--follow]`: the jobs' output from CloudWatch Logs.

The stack's target (infra/targets/) reads them. On a single node the container's awslogs
driver writes into the stack's log group: the node's boot and health gate to
`node-<rank>` (infra/node/templates/run-training.sh), each job to a stream of its own,
`job-<name>` (infra/jobs/spool.py, log_stream), which `--job NAME` reads. On a Slurm
cluster the job's log is its output file (every node's lines in one).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable

from infra import targets
from infra.deployed import workspace
from infra.errors import ConfigError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    workspace.add_stack_argument(parser)
    parser.add_argument("--node", type=int, help="only this node's stream (rank 0, 1, ...)")
    parser.add_argument("--follow", "-f", action="store_true", help="keep printing new lines")
    parser.add_argument(
        "--since", type=float, default=60, help="start this many minutes back (default 60)"
    )
    parser.add_argument(
        "--job",
        help="the job: its name on a single-node stack (as `run --name` gave it); a Slurm "
        "cluster's job id (default: the newest in the queue), whose log starts with its "
        "last 16 KB",
    )


def run(
    args: argparse.Namespace,
    *,
    out=None,
    sleep: Callable[[float], None] = time.sleep,
    now: Callable[[], float] = time.time,
) -> str:
    """The jobs' CloudWatch Logs (--node N, --job NAME), or a Slurm job's log (--job ID)."""
    if not (math.isfinite(args.since) and args.since > 0):  # NaN fails every comparison
        raise ConfigError(f"--since {args.since:g}: give minutes above 0")
    targets.target(workspace.stack_name(args)).logs(
        args, out=out or sys.stdout, sleep=sleep, now=now
    )
    return ""
