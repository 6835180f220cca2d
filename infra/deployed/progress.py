"""A job's progress and the stack's spend, in the words `status` prints them: from the
status.json the trainer keeps beside its checkpoints and the spend guard's ledger."""

from __future__ import annotations

import datetime

from infra.deployed import ledger_spend, workspace
from training.contract import GOODPUT_FIELD, RUN_USD_FIELD, price_field, price_words


def describe_job(status: dict | None, now: datetime.datetime) -> str:
    if status is None:
        return "no progress published yet (the image may still be pulling: see logs)"
    step, total = status["step"], status["total_steps"]
    parts = [
        f"{status['state']} at step {step:,} of {total:,} ({100 * step / total:.0f}%)",
        f"loss {status['loss']:.4f}",
        f"{status['tokens_per_s']:,.0f} {status.get('unit', 'tokens')}/s",
    ]
    if GOODPUT_FIELD in status:  # the whole run's (every start); older trainers lack it
        parts.append(f"goodput {100 * status[GOODPUT_FIELD]:.0f}%")
        price = status.get(price_field(status.get("unit", "tokens")))
        if price is not None:
            parts.append(price_words(price, status.get("unit", "tokens")))
        if RUN_USD_FIELD in status:
            parts.append(f"${status[RUN_USD_FIELD]:,.2f} for the run so far")
    if status["state"] == "training":
        parts.append(f"{_duration(status['seconds_left'])} to finish")
    if status.get("straggler_rank") is not None:  # written by training/stragglers.py
        parts.append(f"rank {status['straggler_rank']} is a straggler (see the job's log)")
    updated = datetime.datetime.fromisoformat(status["updated_at"])
    parts.append(f"as of {_duration((now - updated).total_seconds())} ago")
    return ", ".join(parts)


def unit_cost(hourly_usd: float | None, status: dict | None) -> str:
    """What a billion tokens (or a million images) cost at the job's current rate, with every
    node of the stack running: the figure to compare runs and instance types by."""
    if not hourly_usd or status is None or not status.get("tokens_per_s"):
        return ""
    unit = status.get("unit", "tokens")
    per = 1e9 if unit == "tokens" else 1e6
    usd = hourly_usd / (status["tokens_per_s"] * 3600) * per
    amount = "billion" if per == 1e9 else "million"
    return (
        f"${usd:,.2f} per {amount} {unit} at ${hourly_usd:,.2f}/h and "
        f"{status['tokens_per_s']:,.0f} {unit}/s"
    )


def _duration(seconds: float) -> str:
    minutes = round(max(seconds, 0) / 60)
    if minutes < 60:
        return f"{minutes} min"
    return f"{minutes // 60} h {minutes % 60:02d} min"


def run_spend(stack: workspace.Deployed, published_spans) -> str:
    """What the stack spent while the job ran (each of its starts), from the spend guard's
    ledger: on a single-node stack, the job's cost with its volumes and address."""
    spans = ledger_spend.spans_from(published_spans)
    spent = ledger_spend.spend_reader(stack)(spans)
    return (
        f"${spent:,.2f} over its {len(spans)} start(s) since "
        f"{spans[0][0]:%Y-%m-%d %H:%M} UTC, from the spend guard's ledger"
    )


def spend(stack: workspace.Deployed, now: datetime.datetime) -> str:
    budget = f"budget ${stack.outputs.monthly_budget_usd:,.2f} a month"
    table = stack.outputs.spend_ledger_table
    if not table:
        return f"{budget}; no spend ledger (the stack predates the spend guard: `up` adds it)"
    # The spend guard's own code (it imports boto3: not at start-up, see infra/commands).
    from infra.functions.ledger import read_ledger
    from infra.functions.spend_guard import budget_period

    period, _ = budget_period(now, stack.budget_period)
    ledger = read_ledger(workspace.aws("dynamodb", stack.region), table, period)
    if ledger is None:
        return f"{budget}; the spend guard has not counted {period} yet"
    left = ledger.budget_usd - ledger.spent_usd
    text = (
        f"${ledger.spent_usd:,.2f} of ${ledger.budget_usd:,.2f} in {ledger.period}, "
        f"${left:,.2f} left"
    )
    if ledger.stopped:
        text += f"; the spend guard stopped the stack ({ledger.stop_reason or 'budget spent'})"
    return text
