"""The ledger's spend marks: thinned as they age, stored and read back, and interpolated."""

from __future__ import annotations

import datetime

import pytest

from infra.functions.ledger import Ledger, from_item, to_item

START = datetime.datetime(2026, 12, 1, tzinfo=datetime.UTC)


def _at(minutes: int) -> str:
    return (START + datetime.timedelta(minutes=minutes)).isoformat()


def _run_every_five_minutes(hours: int) -> Ledger:
    """A ledger marked by a run every 5 minutes, at $1 a minute."""
    ledger = Ledger("2026-12", 0.0, 1000.0, False, (), _at(0), _at(0))
    for minute in range(5, hours * 60 + 1, 5):
        ledger = Ledger(
            "2026-12",
            float(minute),
            1000.0,
            False,
            (),
            _at(minute),
            _at(minute),
            marks=ledger.marks,
        ).with_mark()
    return ledger


def test_recent_marks_are_kept_whole_and_older_ones_one_an_hour():
    ledger = _run_every_five_minutes(hours=10)
    times = [datetime.datetime.fromisoformat(when) for when, _ in ledger.marks]
    # The last 6 hours (minutes 240..600) every 5 minutes: 73 marks; the 4 hours before,
    # the last mark of each: 00:55, 01:55, 02:55, 03:55.
    assert len(ledger.marks) == 4 + 73
    assert [t.strftime("%H:%M") for t in times[:4]] == ["00:55", "01:55", "02:55", "03:55"]
    assert times[4] == START + datetime.timedelta(minutes=240)
    assert times == sorted(times)
    assert all(
        spent == (t - START).total_seconds() / 60
        for (_, spent), t in zip(ledger.marks, times, strict=True)
    )


def test_a_months_marks_fit_in_one_dynamodb_item():
    # What a 31-day month of runs leaves: one mark an hour, then every run's for 6 hours.
    minutes = [*range(55, (31 * 24 - 6) * 60, 60), *range((31 * 24 - 6) * 60, 31 * 24 * 60 + 1, 5)]
    end = minutes[-1]
    ledger = Ledger(
        "2026-12", 12345.5, 1000.0, False, (), _at(end), _at(end),
        marks=tuple((_at(m), m * 16.5) for m in minutes),
    )  # fmt: skip
    # DynamoDB's item limit is 400 KB, counted as names plus values; the item's text is more.
    assert len(str(to_item(ledger)).encode()) < 100_000
    assert from_item(to_item(ledger)).marks == ledger.marks


@pytest.mark.parametrize(
    ("minute", "spent"),
    [(0, 0.0), (2.5, 2.5), (62.5, 62.5), (577.5, 577.5), (600, 600.0), (700, 600.0)],
)
def test_the_spend_by_any_instant_is_read_back(minute, spent):
    ledger = _run_every_five_minutes(hours=10)
    instant = START + datetime.timedelta(minutes=minute)
    # $1 a minute throughout: interpolation between the kept marks is exact.
    assert ledger.spent_by(instant, START) == pytest.approx(spent)


def test_marks_stored_as_typed_pairs_read_back():
    ledger = _run_every_five_minutes(hours=10)
    item = to_item(ledger)
    item["marks"] = {"L": [{"L": [{"S": when}, {"N": str(spent)}]} for when, spent in ledger.marks]}
    assert from_item(item).marks == ledger.marks


def test_an_item_without_marks_reads_as_none():
    item = to_item(Ledger("2026-12", 5.0, 10.0, False, (), _at(0), _at(0)))
    del item["marks"]
    assert from_item(item).marks == ()
