"""`status` against moto's server: EC2 states, the trainer's status.json and checkpoint
pointer in S3, and the spend guard's ledger."""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import io
import json

import pytest

from infra.commands import status
from infra.deployed import progress as job_progress
from infra.deployed.checkpoints import POINTER_NAME, STATUS_NAME
from infra.errors import ConfigError
from infra.functions.ledger import PERIOD_KEY, Ledger, write_ledger
from tests.infra.commands.conftest import BUCKET, checkpoint_bucket, launch_nodes, stack_outputs
from training.checkpoint.layout import POINTER_NAME as TRAINER_POINTER
from training.checkpoint.s3 import STATUS_NAME as TRAINER_STATUS

NOW = datetime.datetime(2026, 12, 1, 8, 0, tzinfo=datetime.UTC)
ARGS = argparse.Namespace(stack="l4x1", watch=None)


def test_the_object_names_are_the_trainers():
    assert (POINTER_NAME, STATUS_NAME) == (TRAINER_POINTER, TRAINER_STATUS)


def _deploy(aws, stub_stack, **extra):
    ec2, s3 = aws.client("ec2"), aws.client("s3")
    ids = launch_nodes(ec2, 2, spot=False)
    ec2.stop_instances(InstanceIds=[ids[1]])
    checkpoint_bucket(s3, ["step_00000400"])
    progress = {
        "state": "training",
        "step": 450,
        "total_steps": 1000,
        "loss": 2.71828,
        "tokens_per_s": 45210.0,
        "step_time_s": 1.2,
        "seconds_left": 550 * 1.2,
        "updated_at": (NOW - datetime.timedelta(minutes=2)).isoformat(),
    }
    s3.put_object(Bucket=BUCKET, Key=f"checkpoints/{STATUS_NAME}", Body=json.dumps(progress))
    stub_stack.outputs_ = stack_outputs(ids, spot=False, **extra)
    return ids


def test_nodes_job_checkpoint_and_budget(aws, stub_stack):
    ids = _deploy(aws, stub_stack)
    text = status.run(ARGS, now=lambda: NOW)
    lines = text.splitlines()
    node_rows = [line.split() for line in lines if line.split()[:1] in (["0"], ["1"])]
    assert node_rows == [["0", ids[0], "running", "-"], ["1", ids[1], "stopped", "-"]]
    job = next(line for line in lines if line.startswith("job"))
    assert "training at step 450 of 1,000 (45%)" in job
    assert "loss 2.7183" in job and "45,210 tokens/s" in job
    assert "11 min to finish" in job and "as of 2 min ago" in job  # 550 steps x 1.2 s
    assert "step_00000400" in next(line for line in lines if line.startswith("checkpoint"))
    # The stack's $3.06/h (its hourly_cost_usd output) over 45,210 tokens/s:
    # 3.06 / (45,210 x 3,600) x 1e9 = $18.80 per billion tokens.
    cost = next(line for line in lines if line.startswith("cost"))
    assert cost == "cost        $18.80 per billion tokens at $3.06/h and 45,210 tokens/s"
    spend = next(line for line in lines if line.startswith("spend"))
    assert "budget $100.00 a month" in spend and "no spend ledger" in spend


def test_the_runs_goodput_and_price_from_the_trainer(aws, stub_stack):
    _deploy(aws, stub_stack)
    progress = json.loads(
        aws.client("s3").get_object(Bucket=BUCKET, Key=f"checkpoints/{STATUS_NAME}")["Body"].read()
    )
    progress.update(goodput=0.873, usd_per_billion_tokens=12.5, usd=1234.5)
    aws.client("s3").put_object(
        Bucket=BUCKET, Key=f"checkpoints/{STATUS_NAME}", Body=json.dumps(progress)
    )
    job = next(
        line for line in status.run(ARGS, now=lambda: NOW).splitlines() if line.startswith("job")
    )
    assert "goodput 87%, $12.50 per billion tokens, $1,234.50 for the run so far" in job


def _ledger_table(dynamodb, name: str) -> None:
    """The spend guard's table (infra/components/spend_guard.py): one item per period."""
    dynamodb.create_table(
        TableName=name,
        KeySchema=[{"AttributeName": PERIOD_KEY, "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": PERIOD_KEY, "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )


def _ledger(period: str, spent: float, *, stopped=False) -> Ledger:
    return Ledger(period, spent, 100.0, stopped, (50.0,), NOW.isoformat(), NOW.isoformat(), 3)


def _spend_line(text: str) -> str:
    return next(line for line in text.splitlines() if line.startswith("spend"))


def test_spend_and_budget_left_from_the_ledger(aws, stub_stack):
    _deploy(aws, stub_stack, spend_ledger_table="gpu-stack-l4x1-ledger")
    dynamodb = aws.client("dynamodb")
    _ledger_table(dynamodb, "gpu-stack-l4x1-ledger")
    write_ledger(dynamodb, "gpu-stack-l4x1-ledger", _ledger("2026-11", 99.0), after=0)
    write_ledger(dynamodb, "gpu-stack-l4x1-ledger", _ledger("2026-12", 61.5), after=0)
    spend = _spend_line(status.run(ARGS, now=lambda: NOW))
    assert spend.endswith("$61.50 of $100.00 in 2026-12, $38.50 left")  # this month's item


def test_a_daily_budget_reads_todays_item_and_says_when_the_guard_stopped(aws, stub_stack):
    _deploy(aws, stub_stack, spend_ledger_table="ledger")
    stub_stack.config["gpu:budgetPeriod"] = "DAILY"
    dynamodb = aws.client("dynamodb")
    _ledger_table(dynamodb, "ledger")
    stopped = dataclasses.replace(_ledger("2026-12-01", 100.4, stopped=True), stop_reason="budget")
    write_ledger(dynamodb, "ledger", stopped, after=0)
    spend = _spend_line(status.run(ARGS, now=lambda: NOW))
    assert "$100.40 of $100.00 in 2026-12-01, $-0.40 left" in spend
    assert "the spend guard stopped the stack (budget)" in spend


def test_a_period_the_guard_has_not_counted_yet(aws, stub_stack):
    _deploy(aws, stub_stack, spend_ledger_table="ledger")
    _ledger_table(aws.client("dynamodb"), "ledger")
    assert "has not counted 2026-12 yet" in _spend_line(status.run(ARGS, now=lambda: NOW))


def test_before_the_trainer_published_anything(aws, stub_stack):
    ids = launch_nodes(aws.client("ec2"), 1, spot=True)
    aws.client("s3").create_bucket(Bucket=BUCKET)
    stub_stack.outputs_ = stack_outputs(ids, spot=True)
    text = status.run(ARGS, now=lambda: NOW)
    assert "no progress published yet" in text and "checkpoint  none yet" in text
    assert "sir-" in next(line for line in text.splitlines() if line.split()[:1] == ["0"])


def test_watch_prints_again_until_ctrl_c(aws, stub_stack):
    ids = _deploy(aws, stub_stack)
    ec2 = aws.client("ec2")
    naps = []

    def sleep(seconds):
        naps.append(seconds)
        if len(naps) == 1:
            ec2.start_instances(InstanceIds=[ids[1]])  # the stopped node comes back
        else:
            raise KeyboardInterrupt

    out = io.StringIO()
    args = argparse.Namespace(stack="l4x1", watch=30.0)
    assert status.run(args, now=lambda: NOW, out=out, sleep=sleep) == ""
    reports = out.getvalue().split("stack       l4x1")[1:]
    assert naps == [30.0, 30.0] and len(reports) == 2
    assert f"{ids[1]}  stopped" in reports[0] and f"{ids[1]}  running" in reports[1]


@pytest.mark.parametrize("seconds", [0.0, -5.0, float("nan"), float("inf")])
def test_watch_needs_a_positive_interval(stub_stack, seconds):
    with pytest.raises(ConfigError, match=f"--watch {seconds:g}: give seconds above 0"):
        status.run(argparse.Namespace(stack="l4x1", watch=seconds))
    assert stub_stack.opened == []  # refused before the stack is opened


def test_a_straggler_in_the_published_progress_is_named():
    progress = {
        "state": "training",
        "step": 450,
        "total_steps": 1000,
        "loss": 2.71828,
        "tokens_per_s": 45210.0,
        "step_time_s": 1.2,
        "seconds_left": 660.0,
        "straggler_rank": 5,
        "updated_at": (NOW - datetime.timedelta(minutes=2)).isoformat(),
    }
    line = job_progress.describe_job(progress, NOW)
    assert "11 min to finish, rank 5 is a straggler (see the job's log), as of 2 min ago" in line
    assert "straggler" not in job_progress.describe_job({**progress, "straggler_rank": None}, NOW)


def _marked(period: str, until: str, spent: float, marks) -> Ledger:
    return dataclasses.replace(
        _ledger(period, spent), accounted_until=until, updated_at=until, marks=tuple(marks)
    )


def _with_run_spans(aws, spans) -> None:
    key = f"checkpoints/{STATUS_NAME}"
    progress = json.loads(aws.client("s3").get_object(Bucket=BUCKET, Key=key)["Body"].read())
    progress["run_spans"] = spans
    aws.client("s3").put_object(Bucket=BUCKET, Key=key, Body=json.dumps(progress))


# The ledgers below: November's $99.00 by midnight, $90.00 marked at 20:00; December's $8.00
# by 08:00 (NOW), $4.00 marked at 04:00. Between marks, spend reads as linear.
@pytest.mark.parametrize(
    ("spans", "expected"),
    [
        # Since 02:00: $8.00 less $2.00 by 02:00 (halfway from $0 at midnight to $4.00).
        ([["2026-12-01T02:00:00+00:00", "2026-12-01T08:00:00+00:00"]],
         "$6.00 over its 1 start(s) since 2026-12-01 02:00 UTC"),
        # Across the month's end: November's $99.00 less $94.50 by 22:00 (halfway between
        # $90.00 at 20:00 and $99.00 at midnight), plus December's $8.00.
        ([["2026-11-30T22:00:00+00:00", "2026-12-01T08:00:00+00:00"]],
         "$12.50 over its 1 start(s) since 2026-11-30 22:00 UTC"),
        # Two starts, the node doing something else from midnight to 04:00: $4.50 of
        # November, then $8.00 less the $4.00 marked at 04:00.
        ([["2026-11-30T22:00:00+00:00", "2026-12-01T00:00:00+00:00"],
          ["2026-12-01T04:00:00+00:00", "2026-12-01T08:00:00+00:00"]],
         "$8.50 over its 2 start(s) since 2026-11-30 22:00 UTC"),
    ],
)  # fmt: skip
def test_the_runs_spend_from_the_ledgers_marks(aws, stub_stack, spans, expected):
    _deploy(aws, stub_stack, spend_ledger_table="ledger")
    _with_run_spans(aws, spans)
    dynamodb = aws.client("dynamodb")
    _ledger_table(dynamodb, "ledger")
    november = _marked(
        "2026-11", "2026-12-01T00:00:00+00:00", 99.0, [("2026-11-30T20:00:00+00:00", 90.0)]
    )
    december = _marked("2026-12", NOW.isoformat(), 8.0, [("2026-12-01T04:00:00+00:00", 4.0)])
    write_ledger(dynamodb, "ledger", november, after=0)
    write_ledger(dynamodb, "ledger", december, after=0)
    lines = status.run(ARGS, now=lambda: NOW).splitlines()
    run_spend = next(line for line in lines if line.startswith("run spend"))
    assert run_spend == f"run spend   {expected}, from the spend guard's ledger"


def test_no_run_spend_without_a_ledger(aws, stub_stack):
    _deploy(aws, stub_stack)
    _with_run_spans(aws, [["2026-12-01T02:00:00+00:00", "2026-12-01T08:00:00+00:00"]])
    assert not any(
        line.startswith("run spend") for line in status.run(ARGS, now=lambda: NOW).splitlines()
    )
