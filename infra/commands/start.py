"""`start [STACK]`: start stopped nodes again; the boot unit resumes the job from its last
committed checkpoint (local disk, or S3 when newer).
"""

from __future__ import annotations

import argparse

from infra.commands import nodes, workspace
from infra.commands.checkpoints import last_checkpoint


def add_arguments(parser: argparse.ArgumentParser) -> None:
    workspace.add_stack_argument(parser)


def run(args: argparse.Namespace) -> str:
    """Start the stopped nodes again; the job resumes from its last checkpoint."""
    stack = workspace.deployed(workspace.stack_name(args))
    ec2 = workspace.aws("ec2", stack.region)
    stopped = [n.instance_id for n in nodes.nodes(ec2, stack.instance_ids) if n.state == "stopped"]
    if not stopped:
        return (
            f"no node of {stack.name} is stopped: nothing to start (see `python -m infra status`)"
        )
    ec2.start_instances(InstanceIds=stopped)
    checkpoint = last_checkpoint(workspace.aws("s3", stack.region), stack.checkpoint_uri)
    return (
        f"starting {len(stopped)} node(s) of {stack.name}; the job resumes from "
        f"{checkpoint.describe() if checkpoint else 'step 0 (no checkpoint in S3 yet)'}. "
        f"Follow it with `python -m infra logs {stack.name} --follow`."
    )
