"""A ParallelCluster cluster's compute-fleet status: what `pcluster update-compute-fleet`
reads and writes, for the spend guard (stop at the budget) and `start` (start again).

ParallelCluster 3.2+ keeps the fleet's status in the item Id=COMPUTE_FLEET of the table
`parallelcluster-<cluster name>`, as Data.status and Data.lastStatusUpdatedTime
(str(datetime.now(tz=timezone.utc))), and changes it only from the status it had: a stop
from anything but STOP_REQUESTED/STOPPING/STOPPED, a start only from STOPPED
(aws-parallelcluster v3.15.1, cli/src/pcluster/models/compute_fleet_status_manager.py,
JsonComputeFleetStatusManager._put_status and ComputeFleetStatusManager.update_status;
table: cli/src/pcluster/templates/cluster_stack.py, PCLUSTER_DYNAMODB_PREFIX + stack name).
clustermgtd on the head node acts on a request: STOP_REQUESTED -> STOPPING -> STOPPED
(compute nodes terminated, partitions INACTIVE), START_REQUESTED -> STARTING -> RUNNING.
Standard library and boto3 only: the guard's Lambda archive carries this module.
"""

from __future__ import annotations

import datetime
from typing import Any

TABLE_PREFIX = "parallelcluster-"
ITEM_ID = "COMPUTE_FLEET"
STOP_REQUESTED = "STOP_REQUESTED"
STOPPING = (STOP_REQUESTED, "STOPPING", "STOPPED")
STOPPED = "STOPPED"
START_REQUESTED = "START_REQUESTED"
# The error a conditional write refused by its condition raises (DynamoDB API reference,
# UpdateItem, "ConditionalCheckFailedException").
CONDITION_FAILED = "ConditionalCheckFailedException"

_NAMES = {"#data": "Data", "#status": "status", "#updated": "lastStatusUpdatedTime"}


def status(dynamodb: Any, cluster_name: str) -> str | None:
    """The fleet's status; None when the cluster has no status item (yet)."""
    item = dynamodb.get_item(
        TableName=TABLE_PREFIX + cluster_name, Key={"Id": {"S": ITEM_ID}}, ConsistentRead=True
    ).get("Item")
    return item["Data"]["M"]["status"]["S"] if item else None


def request_stop(dynamodb: Any, cluster_name: str, now: datetime.datetime) -> None:
    """STOP_REQUESTED, unless it is stopping or stopped already (ClientError CONDITION_FAILED)."""
    _put(
        dynamodb,
        cluster_name,
        STOP_REQUESTED,
        now,
        "attribute_exists(Id) AND NOT #data.#status IN (:s1, :s2, :s3)",
        {f":s{n}": {"S": s} for n, s in enumerate(STOPPING, 1)},
    )


def request_start(dynamodb: Any, cluster_name: str, now: datetime.datetime) -> None:
    """START_REQUESTED, only from STOPPED (ClientError CONDITION_FAILED otherwise)."""
    _put(
        dynamodb,
        cluster_name,
        START_REQUESTED,
        now,
        "#data.#status = :stopped",
        {":stopped": {"S": STOPPED}},
    )


def _put(dynamodb, cluster_name, new_status, now, condition, values) -> None:
    dynamodb.update_item(
        TableName=TABLE_PREFIX + cluster_name,
        Key={"Id": {"S": ITEM_ID}},
        UpdateExpression="SET #data.#status = :new, #data.#updated = :now",
        ConditionExpression=condition,
        ExpressionAttributeNames=_NAMES,
        ExpressionAttributeValues={":new": {"S": new_status}, ":now": {"S": str(now)}, **values},
    )
