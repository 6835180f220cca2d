"""What the commands do to a stack's nodes through EC2 and SSM: read their state, stop the
job cleanly, stop and start the instances, cancel their spot requests.

AWS facts this relies on:
- `systemctl stop gpu-training` runs the unit's ExecStop, `docker stop --time 100`
  (infra/node/templates/gpu-training.service): SIGTERM, the trainer checkpoints and
  exits 75; systemd does not restart a unit stopped by hand. The command reaches the
  node through SSM Run Command's AWS-RunShellScript document (the instance role has
  AmazonSSMManagedInstanceCore); only a running, SSM-registered instance takes it
  (docs.aws.amazon.com/systems-manager/latest/userguide/run-command.html).
- A persistent spot request outlives its instance and launches a replacement that
  no stack tracks unless it is cancelled first (EC2 User Guide, "Cancel a Spot
  Instance request"; hashicorp/terraform-provider-aws issue 38142). Requests are found
  with DescribeSpotInstanceRequests' `instance-id` filter (EC2 API reference).
- A stopped persistent spot instance carries its request's status code: AWS stopped it
  and will start it when capacity returns (`instance-stopped-no-capacity`, ...), or the
  owner did (`instance-stopped-by-user`) (EC2 User Guide, "Spot request status").
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

STOP_JOB = "systemctl stop gpu-training"
# ExecStop gives the trainer 100 s and systemd 120 s in all: a little more to come back.
STOP_JOB_TIMEOUT_S = 180
POLL_S = 5.0
# Spot request status codes of a stopped instance that AWS will start again by itself.
WAITING_FOR_CAPACITY = frozenset(
    {
        "instance-stopped-no-capacity",
        "instance-stopped-by-price",
        "instance-stopped-capacity-oversubscribed",
        "capacity-not-available",
        "capacity-oversubscribed",
        "price-too-low",
        "pending-fulfillment",
        "pending-evaluation",
    }
)
# The request's code while AWS is stopping the instance (the two-minute notice).
BEING_INTERRUPTED = frozenset({"marked-for-stop", "marked-for-termination"})


@dataclass(frozen=True)
class Node:
    rank: int
    instance_id: str
    state: str  # running, stopped, interrupted, waiting for capacity, pending, ...
    spot_request: str | None


def spot_requests(ec2: Any, instance_ids: Sequence[str]) -> dict[str, dict]:
    """instance id -> its spot request (open, active or disabled), for the stack's nodes."""
    if not instance_ids:
        return {}
    found = ec2.describe_spot_instance_requests(
        Filters=[{"Name": "instance-id", "Values": list(instance_ids)}]
    )["SpotInstanceRequests"]
    return {request["InstanceId"]: request for request in found if request.get("InstanceId")}


def node_state(instance_state: str, request: dict | None) -> str:
    """One word (or three) for a node: its EC2 state, read through its spot request."""
    code = (request or {}).get("Status", {}).get("Code", "")
    if code in BEING_INTERRUPTED:
        return "interrupted"
    if instance_state == "stopped" and code in WAITING_FOR_CAPACITY:
        return "waiting for capacity"
    return instance_state


def nodes(ec2: Any, instance_ids: Sequence[str]) -> list[Node]:
    """Every node of the stack in rank order (the order of the instance_ids output)."""
    states = {}
    # A filter, not InstanceIds: an ID EC2 no longer knows is then just missing (a node
    # "gone"), where InstanceIds would fail the whole call (EC2 API reference).
    pages = ec2.get_paginator("describe_instances").paginate(
        Filters=[{"Name": "instance-id", "Values": list(instance_ids)}]
    )
    for page in pages:
        for reservation in page["Reservations"]:
            for instance in reservation["Instances"]:
                states[instance["InstanceId"]] = instance["State"]["Name"]
    requests = spot_requests(ec2, instance_ids)
    return [
        Node(
            rank,
            instance_id,
            node_state(states.get(instance_id, "gone"), requests.get(instance_id)),
            requests.get(instance_id, {}).get("SpotInstanceRequestId"),
        )
        for rank, instance_id in enumerate(instance_ids)
    ]


@dataclass(frozen=True)
class Invocation:
    """How a script sent through SSM ended on one instance, and what it printed."""

    status: str  # Success, Failed, Cancelled, TimedOut
    stdout: str = ""
    stderr: str = ""


FINAL_STATUSES = ("Success", "Failed", "Cancelled", "TimedOut")


def run_script(
    ssm: Any,
    instance_ids: Sequence[str],
    script: str,
    *,
    comment: str,
    timeout_s: float,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Invocation]:
    """Run a shell script as root on each instance (AWS-RunShellScript), wait for the end.

    Its `commands` are the script's lines, which SSM writes into one script file.
    """
    command = ssm.send_command(
        InstanceIds=list(instance_ids),
        DocumentName="AWS-RunShellScript",
        Comment=comment,
        Parameters={"commands": script.splitlines(), "executionTimeout": [str(int(timeout_s))]},
    )["Command"]["CommandId"]
    done: dict[str, Invocation] = {}
    deadline = time.monotonic() + timeout_s + 60
    while len(done) < len(instance_ids):
        for instance_id in instance_ids:
            if instance_id in done:
                continue
            try:
                reply = ssm.get_command_invocation(CommandId=command, InstanceId=instance_id)
            except ssm.exceptions.InvocationDoesNotExist:
                continue  # not registered yet: SSM takes a moment after SendCommand
            if reply["Status"] in FINAL_STATUSES:
                done[instance_id] = Invocation(
                    reply["Status"],
                    reply.get("StandardOutputContent", ""),
                    reply.get("StandardErrorContent", ""),
                )
        if len(done) < len(instance_ids):
            if time.monotonic() > deadline:
                done.update({i: Invocation("TimedOut") for i in instance_ids if i not in done})
                break
            sleep(POLL_S)
    return done


def stop_job(
    ssm: Any,
    instance_ids: Sequence[str],
    *,
    say: Callable[[str], None],
    sleep: Callable[[float], None] = time.sleep,
    timeout_s: float = STOP_JOB_TIMEOUT_S,
) -> dict[str, str]:
    """SIGTERM the job on each running node and wait until it has checkpointed and exited.

    Returns instance id -> SSM's final status (Success, Failed, TimedOut, ...).
    """
    if not instance_ids:
        return {}
    say(f"stopping the job on {len(instance_ids)} node(s): it checkpoints first (up to 2 min)")
    ended = run_script(
        ssm,
        instance_ids,
        STOP_JOB,
        comment="gpu-training-stack: checkpoint and stop the training job",
        timeout_s=timeout_s,
        sleep=sleep,
    )
    return {instance_id: invocation.status for instance_id, invocation in ended.items()}


def cancel_spot_requests(ec2: Any, instance_ids: Sequence[str]) -> list[str]:
    """Cancel the nodes' spot requests (their instances stay as they are); the IDs."""
    ids = [r["SpotInstanceRequestId"] for r in spot_requests(ec2, instance_ids).values()]
    if ids:
        ec2.cancel_spot_instance_requests(SpotInstanceRequestIds=ids)
    return ids
