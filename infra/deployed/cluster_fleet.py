"""A cluster stack's compute fleet, stopped and started the way `pcluster
update-compute-fleet` does it (infra/functions/fleet.py), for `up` (an update that needs
the fleet stopped) and `start` (after the spend guard stopped it at the budget).

clustermgtd on the head node acts on a request within its 60-second loop: STOP_REQUESTED ->
STOPPING -> STOPPED once it has terminated the compute nodes and set the partitions
INACTIVE; START_REQUESTED -> STARTING -> RUNNING (aws-parallelcluster v3.15.1,
cli/src/pcluster/models/compute_fleet_status_manager.py). A start is taken only from
STOPPED, so a stop must finish first.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable

from botocore.exceptions import ClientError

from infra.deployed import workspace
from infra.errors import ConfigError
from infra.functions import fleet

# How long a command waits for clustermgtd to finish a stop (STOP_REQUESTED -> STOPPING ->
# STOPPED): its loop, then the compute nodes' termination.
FLEET_STOP_WAIT_S = 600
FLEET_POLL_S = 10


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def wait_until_stopped(
    stack: workspace.Deployed, status: str | None, *, sleep: Callable[[float], None]
) -> None:
    """Poll the fleet's status until STOPPED; ConfigError after FLEET_STOP_WAIT_S."""
    dynamodb = workspace.aws("dynamodb", stack.region)
    waited = 0
    while status != fleet.STOPPED:
        if waited >= FLEET_STOP_WAIT_S:
            raise ConfigError(
                f"the compute fleet of {stack.name} is still {status} after {waited} s: run "
                f"`python -m infra start {stack.name}` again in a few minutes"
            )
        sleep(FLEET_POLL_S)
        waited += FLEET_POLL_S
        status = fleet.status(dynamodb, stack.outputs.cluster_name)


def stop_fleet(
    stack: workspace.Deployed, *, say: Callable[[str], None], sleep: Callable[[float], None]
) -> None:
    """STOP_REQUESTED, then wait for STOPPED: clustermgtd has terminated every compute node."""
    dynamodb = workspace.aws("dynamodb", stack.region)
    try:
        fleet.request_stop(dynamodb, stack.outputs.cluster_name, _now())
    except ClientError as exc:
        if exc.response["Error"]["Code"] != fleet.CONDITION_FAILED:
            raise
        # Stopping or stopped already.
    say(f"compute fleet {fleet.STOP_REQUESTED}: waiting for ParallelCluster to stop it")
    wait_until_stopped(stack, fleet.status(dynamodb, stack.outputs.cluster_name), sleep=sleep)
    say(f"compute fleet {fleet.STOPPED}")


def start_fleet(
    stack: workspace.Deployed, *, say: Callable[[str], None], sleep: Callable[[float], None]
) -> None:
    """START_REQUESTED when the fleet is stopped or stopping (after the stop has finished);
    nothing when it runs."""
    dynamodb = workspace.aws("dynamodb", stack.region)
    status = fleet.status(dynamodb, stack.outputs.cluster_name)
    if status not in fleet.STOPPING:
        return
    if status != fleet.STOPPED:
        say(f"the compute fleet is {status}: waiting for ParallelCluster to finish the stop")
        wait_until_stopped(stack, status, sleep=sleep)
    try:
        fleet.request_start(dynamodb, stack.outputs.cluster_name, _now())
    except ClientError as exc:
        if exc.response["Error"]["Code"] != fleet.CONDITION_FAILED:
            raise
        # Someone started it between the read and the write: started all the same.
    say(f"compute fleet {fleet.START_REQUESTED}: ParallelCluster makes the queue active again")
