"""The spend ledger: one DynamoDB item per budget period, written by the spend guard.

`read_ledger` is also what the command line uses to show a stack's spend. Every write is
conditional on the item's `version` (docs.aws.amazon.com/amazondynamodb/latest/developerguide/
Expressions.ConditionExpressions.html): two invocations that raced, or a retried one, cannot
both add the same minutes.
"""

from __future__ import annotations

import dataclasses
import datetime
import itertools
import json
from dataclasses import dataclass
from typing import Any

PERIOD_KEY = "period"  # the table's partition key (a string)
# Spend marks (see Ledger.marks): every run's within this span of the newest, one an hour
# before it; a month of them stays far below DynamoDB's 400 KB item limit
# (docs.aws.amazon.com/amazondynamodb/latest/developerguide/ServiceQuotas.html).
MARKS_IN_FULL = datetime.timedelta(hours=6)


@dataclass(frozen=True)
class Ledger:
    """What a stack spent in one budget period, up to `accounted_until`.

    `running` lists the instances that were running (or pending) at `accounted_until`: an
    instance among them found restarted later was stopped at a time EC2 no longer says, and is
    counted as running through the gap (counting too much, never too little).
    """

    period: str  # "2026-12" for a monthly budget, "2026-12-01" for a daily one
    spent_usd: float
    budget_usd: float
    stopped: bool
    notified_thresholds: tuple[float, ...]
    updated_at: str  # ISO 8601, UTC
    accounted_until: str = ""  # ISO 8601, UTC: spend before this instant is in spent_usd
    version: int = 0  # 0: not yet written
    running: tuple[str, ...] = ()
    stop_reason: str = ""
    # Notices SNS did not take, as (subject, message): published again at the next run.
    unsent: tuple[tuple[str, str], ...] = ()
    # Capacity Blocks whose whole fee is in spent_usd: each is counted once, up front.
    prepaid_blocks: tuple[str, ...] = ()
    # (volume id, $ a month) of the stack's volumes at `accounted_until`: one deleted before
    # the next run is counted through that run's window.
    volumes: tuple[tuple[str, float], ...] = ()
    # The instances that had a public IPv4 address at `accounted_until` (EC2 drops it when
    # one stops): its hours until the stop are charged for the address too.
    addressed: tuple[str, ...] = ()
    # (accounted_until, spent_usd) after each run, thinned by `with_mark`: what the stack had
    # spent by then, so that the spend of a span (one job's run) can be read back.
    marks: tuple[tuple[str, float], ...] = ()

    @property
    def accounted_until_time(self) -> datetime.datetime:
        return datetime.datetime.fromisoformat(self.accounted_until)

    def with_mark(self) -> Ledger:
        """This ledger with its own (accounted_until, spent_usd) marked: every mark of the
        last MARKS_IN_FULL kept, and of the older ones the last of each hour."""
        newest = self.accounted_until_time
        kept: dict[str, tuple[str, float]] = {}
        for when, spent in (*self.marks, (self.accounted_until, self.spent_usd)):
            at = datetime.datetime.fromisoformat(when)
            key = when if newest - at <= MARKS_IN_FULL else at.strftime("%Y-%m-%dT%H")
            kept[key] = (when, spent)  # marks are in time order: the hour's last one stays
        return dataclasses.replace(self, marks=tuple(kept.values()))

    def spent_by(self, instant: datetime.datetime, period_start: datetime.datetime) -> float:
        """What the stack had spent in this period by `instant`, interpolated between the
        marks around it (0 at the period's start; the latest figure past the last mark)."""
        points = [(period_start, 0.0)] + [
            (datetime.datetime.fromisoformat(when), spent) for when, spent in self.marks
        ]
        points.append((self.accounted_until_time, self.spent_usd))
        if instant <= period_start:
            return 0.0
        for (t0, s0), (t1, s1) in itertools.pairwise(points):
            if t0 <= instant <= t1:
                share = (instant - t0) / (t1 - t0) if t1 > t0 else 1.0
                return s0 + share * (s1 - s0)
        return self.spent_usd


def _number(value: float) -> str:
    """Plain decimal text: DynamoDB numbers are strings, and 1e-05 is not plain."""
    return f"{value:.10f}".rstrip("0").rstrip(".")


def to_item(ledger: Ledger) -> dict[str, Any]:
    item: dict[str, Any] = {
        PERIOD_KEY: {"S": ledger.period},
        "spent_usd": {"N": _number(ledger.spent_usd)},
        "budget_usd": {"N": _number(ledger.budget_usd)},
        "stopped": {"BOOL": ledger.stopped},
        "notified_thresholds": {"L": [{"N": _number(t)} for t in ledger.notified_thresholds]},
        "updated_at": {"S": ledger.updated_at},
        "accounted_until": {"S": ledger.accounted_until},
        "version": {"N": str(ledger.version)},
        "running": {"L": [{"S": instance_id} for instance_id in ledger.running]},
        "stop_reason": {"S": ledger.stop_reason},
        "unsent": {"L": [{"L": [{"S": part} for part in notice]} for notice in ledger.unsent]},
        "prepaid_blocks": {"L": [{"S": block} for block in ledger.prepaid_blocks]},
        "volumes": {
            "L": [
                {"L": [{"S": volume_id}, {"N": _number(monthly)}]}
                for volume_id, monthly in ledger.volumes
            ]
        },
        "addressed": {"L": [{"S": instance_id} for instance_id in ledger.addressed]},
        # One string, not a list of typed pairs: DynamoDB's typed JSON of hundreds of pairs
        # takes every reader (the guard at each run, `status`) many times longer to decode.
        "marks": {"S": json.dumps(ledger.marks)},
    }
    return item


def from_item(item: dict[str, Any]) -> Ledger:
    return Ledger(
        period=item[PERIOD_KEY]["S"],
        spent_usd=float(item["spent_usd"]["N"]),
        budget_usd=float(item["budget_usd"]["N"]),
        stopped=item["stopped"]["BOOL"],
        notified_thresholds=tuple(float(t["N"]) for t in item["notified_thresholds"]["L"]),
        updated_at=item["updated_at"]["S"],
        accounted_until=item["accounted_until"]["S"],
        version=int(item["version"]["N"]),
        running=tuple(entry["S"] for entry in item["running"]["L"]),
        stop_reason=item["stop_reason"]["S"],
        # Absent from items written before these fields existed.
        unsent=tuple(
            (notice["L"][0]["S"], notice["L"][1]["S"])
            for notice in item.get("unsent", {"L": []})["L"]
        ),
        prepaid_blocks=tuple(b["S"] for b in item.get("prepaid_blocks", {"L": []})["L"]),
        volumes=tuple(
            (volume["L"][0]["S"], float(volume["L"][1]["N"]))
            for volume in item.get("volumes", {"L": []})["L"]
        ),
        addressed=tuple(a["S"] for a in item.get("addressed", {"L": []})["L"]),
        marks=_marks(item.get("marks")),
    )


def _marks(value: dict[str, Any] | None) -> tuple[tuple[str, float], ...]:
    if value is None:
        return ()
    if "L" in value:  # written as a list of [when, spent] pairs before marks were one string
        return tuple((mark["L"][0]["S"], float(mark["L"][1]["N"])) for mark in value["L"])
    return tuple((when, float(spent)) for when, spent in json.loads(value["S"]))


def read_item(dynamodb_client: Any, table_name: str, period: str) -> dict[str, Any] | None:
    """The period's stored item as DynamoDB returns it, or None before the first write."""
    response = dynamodb_client.get_item(
        TableName=table_name, Key={PERIOD_KEY: {"S": period}}, ConsistentRead=True
    )
    return response.get("Item")


def read_ledger(dynamodb_client: Any, table_name: str, period: str) -> Ledger | None:
    """The period's ledger, or None before the guard's first write in that period."""
    item = read_item(dynamodb_client, table_name, period)
    return from_item(item) if item else None


def write_ledger(
    dynamodb_client: Any, table_name: str, ledger: Ledger, *, after: int | None
) -> None:
    """Store `ledger` if the stored item is still at version `after` (0: none stored yet;
    None: replace whatever is stored, an item the guard could not read).

    Raises the client's ConditionalCheckFailedException when another write came first.
    """
    if after is None:
        condition: dict[str, Any] = {}
    elif after == 0:
        condition = {"ConditionExpression": f"attribute_not_exists({PERIOD_KEY})"}
    else:
        condition = {
            "ConditionExpression": "version = :after",
            "ExpressionAttributeValues": {":after": {"N": str(after)}},
        }
    dynamodb_client.put_item(TableName=table_name, Item=to_item(ledger), **condition)
