"""Side-by-side timing: variants run in interleaved rounds (A, B, A, B, ...), medians kept.

The machines these run on are shared, so an absolute time means little; a ratio against a
baseline measured in the same rounds carries, because a change in load hits both alike.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping


def interleaved(variants: Mapping[str, Callable[[], float]], rounds: int) -> dict[str, list[float]]:
    """Call each variant once per round, the order rotated each round; their returned figures."""
    names = list(variants)
    figures: dict[str, list[float]] = {name: [] for name in names}
    for round_ in range(rounds):
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            figures[name].append(variants[name]())
    return figures


def timed(work: Callable[[], object]) -> float:
    """Seconds one call of ``work`` takes."""
    started = time.perf_counter()
    work()
    return time.perf_counter() - started


def median(values: list[float]) -> float:
    return statistics.median(values)


def metric(
    label: str,
    value: float | None,
    unit: str,
    *,
    baseline: float | None = None,
    baseline_label: str | None = None,
    ratio: float | None = None,
    target: str | None = None,
    higher_is_better: bool = True,
) -> dict:
    """One row of a benchmark's result; the ratio is value / baseline unless given."""
    if ratio is None and value is not None and baseline:
        ratio = value / baseline
    return {
        "label": label,
        "value": value,
        "unit": unit,
        "baseline": baseline,
        "baseline_label": baseline_label,
        "ratio": ratio,
        "target": target,
        "higher_is_better": higher_is_better,
    }
