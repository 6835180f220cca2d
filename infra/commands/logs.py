"""`logs [STACK] [--node N | --job NAME] [--follow]`: the jobs' output from CloudWatch Logs.

The container's awslogs driver writes into the stack's log group: the node's boot and
health gate to `node-<rank>` (infra/node/templates/run-training.sh), each job to a stream
of its own, `job-<name>` (infra/jobs/spool.py, log_stream), which `--job NAME` reads.
FilterLogEvents returns the events of several streams a page at a time (`nextToken`), from
`startTime` in milliseconds (CloudWatch Logs API reference, FilterLogEvents).

On a Slurm cluster stack the job's log is its output file (train-<job id>.out, every
node's lines in one), read on the head node piece by piece (infra/cluster/control.py).
"""

from __future__ import annotations

import argparse
import datetime
import sys
import time
from collections.abc import Callable

from infra.cluster.control import log_script, parse_log_piece
from infra.commands import head_node, workspace
from infra.errors import ConfigError
from infra.jobs import spool

FOLLOW_POLL_S = 3.0


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
    out = out or sys.stdout
    stack = workspace.deployed(workspace.stack_name(args))
    if stack.is_cluster:
        return job_log(stack, args, out=out, sleep=sleep)
    if args.job is not None and args.node is not None:
        raise ConfigError("--job and --node: give one (a job's stream, or a node's own lines)")
    nodes = len(stack.instance_ids)
    if args.node is not None and not 0 <= args.node < nodes:
        raise ConfigError(f"--node {args.node}: stack {stack.name} has nodes 0 to {nodes - 1}")
    if args.since <= 0:
        raise ConfigError(f"--since {args.since:g}: give minutes above 0")
    group = stack.outputs.log_group
    streams = [f"node-{args.node}"] if args.node is not None else None
    if args.job is not None:
        streams = [spool.log_stream(spool.check_name(args.job, flag="--job"))]
    logs = workspace.aws("logs", stack.region)
    start = int((now() - args.since * 60) * 1000)
    seen: set[str] = set()
    try:
        while True:
            # Sorted here: the order of events across streams within a reply is not promised.
            for event in sorted(_events(logs, group, streams, start), key=_when):
                if event["eventId"] in seen:
                    continue  # the window overlaps the last poll's by one millisecond
                seen.add(event["eventId"])
                start = max(start, event["timestamp"])
                out.write(_line(event))
            out.flush()
            if not args.follow:
                break
            sleep(FOLLOW_POLL_S)
    except KeyboardInterrupt:
        pass
    except logs.exceptions.ResourceNotFoundException:
        raise ConfigError(
            f"log group {group} or its stream is not there yet: the node writes it once "
            "the container starts (`python -m infra status` shows the nodes)"
        ) from None
    return ""


def _events(logs, group: str, streams: list[str] | None, start: int):
    query = {"logGroupName": group, "startTime": start}
    if streams:
        query["logStreamNames"] = streams
    while True:
        page = logs.filter_log_events(**query)
        yield from page["events"]
        if not page.get("nextToken"):
            return
        query["nextToken"] = page["nextToken"]


def _when(event: dict) -> tuple[int, str]:
    return event["timestamp"], event["logStreamName"]


def _line(event: dict) -> str:
    when = datetime.datetime.fromtimestamp(event["timestamp"] / 1000, datetime.UTC)
    message = event["message"].rstrip("\n")
    return f"{event['logStreamName']}  {when:%H:%M:%S}  {message}\n"


def job_log(stack: workspace.Deployed, args: argparse.Namespace, *, out, sleep) -> str:
    """A cluster job's output file, its last piece first, then (--follow) what it adds."""
    if args.node is not None:
        raise ConfigError(
            f"--node: a job's log on the cluster {stack.name} holds every node's lines; "
            "choose the job with --job ID"
        )
    job_id = args.job
    if job_id is None:
        jobs = head_node.queue(stack, sleep=sleep)
        if not jobs:
            raise ConfigError(
                f"the queue of {stack.name} is empty: name a finished job with --job ID"
            )
        job_id = max(jobs, key=lambda job: int(job.id)).id
    elif not job_id.isdigit():
        raise ConfigError(f"--job {job_id}: a Slurm job id is a number, e.g. --job 12")
    offset = -1  # the file's last piece
    try:
        while True:
            start, piece = parse_log_piece(
                head_node.on_head_node(
                    stack,
                    log_script(job_id, offset),
                    what=f"read job {job_id}'s log",
                    timeout_s=60,
                    sleep=sleep,
                )
            )
            out.write(piece)
            out.flush()
            offset = start + len(piece.encode())
            if piece:
                continue  # more may be there already: read on before waiting
            if not args.follow:
                break
            sleep(FOLLOW_POLL_S)
    except KeyboardInterrupt:
        pass
    return ""
