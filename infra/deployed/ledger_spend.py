"""What a stack spent over spans of time, read from the spend guard's ledger.

Each guard run marks in its period's item what the stack had spent by then
(infra/functions/ledger.py: Ledger.marks), so the spend over any span is the
difference of two readings, interpolated between marks, summed over the budget
periods the span crosses. `status` and `jobs` price a job's starts with it.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Iterable
from typing import Any

from infra.deployed import workspace

Span = tuple[datetime.datetime, datetime.datetime]


def spans_from(published: Iterable[Iterable[str]]) -> list[Span]:
    """The trainer's [began, last counted] pairs (training.contract.RUN_SPANS_FIELD)."""
    return [
        (datetime.datetime.fromisoformat(start), datetime.datetime.fromisoformat(end))
        for start, end in published
    ]


def spend_reader(stack: workspace.Deployed) -> Callable[[Iterable[Span]], float]:
    """The stack's spend over spans, as the ledger of each period they cross counted it (a
    period the guard has not counted adds nothing). Each period's item is read once, however
    many spans (jobs) are priced with the same reader."""
    # The spend guard's own code (it imports boto3: not at start-up, see infra/commands).
    from infra.functions.ledger import read_ledger
    from infra.functions.spend_guard import budget_period

    dynamodb = workspace.aws("dynamodb", stack.region)
    ledgers: dict[str, Any] = {}

    def spend_over(spans: Iterable[Span]) -> float:
        spent = 0.0
        for start, end in spans:
            instant = end
            while True:
                period, period_start = budget_period(instant, stack.budget_period)
                if period not in ledgers:
                    ledgers[period] = read_ledger(
                        dynamodb, stack.outputs.spend_ledger_table, period
                    )
                ledger = ledgers[period]
                if ledger is not None:
                    spent += ledger.spent_by(instant, period_start) - ledger.spent_by(
                        max(start, period_start), period_start
                    )
                if start >= period_start:
                    break
                instant = period_start - datetime.timedelta(microseconds=1)
        return spent

    return spend_over
