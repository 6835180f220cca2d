"""`stop [STACK]`: checkpoint the job and stop the nodes; the disks, addresses and bill for
storage stay, the GPU bill stops. `start` brings them back and the job resumes.

The stack's target (infra/targets/) does it: a single node's job is stopped through SSM,
then the instance; a Slurm cluster's queue is held (running jobs checkpoint and go back to
it) and ParallelCluster ends the idle compute nodes, while the head node keeps the queue.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

from infra import targets
from infra.deployed import workspace


def add_arguments(parser: argparse.ArgumentParser) -> None:
    workspace.add_stack_argument(parser)


def run(args: argparse.Namespace, *, out=None, sleep: Callable[[float], None] = time.sleep) -> str:
    """Checkpoint the job, then stop every node or hold the Slurm queue (start resumes)."""
    say = workspace.printer(out or sys.stdout)
    return targets.target(workspace.stack_name(args)).stop(say=say, sleep=sleep)
