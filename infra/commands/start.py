"""`start [STACK]`: start stopped nodes again; the boot unit resumes the job from its last
committed checkpoint (local disk, or S3 when newer).

The stack's target (infra/targets/) does it: a single node's instances start again; a
Slurm cluster's head node and compute fleet start if the spend guard stopped them, and
the held jobs are released; each resumes from its checkpoint.
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
    """Start the stopped nodes or release the held Slurm queue; jobs resume."""
    say = workspace.printer(out or sys.stdout)
    return targets.target(workspace.stack_name(args)).start(say=say, sleep=sleep)
