"""Interleaved rounds and result rows (bench/measure.py)."""

from __future__ import annotations

import pytest

from bench.measure import interleaved, median, metric


def test_interleaved_rotates_the_order_and_keeps_each_variants_figures():
    calls = []

    def variant(name, figure):
        def call():
            calls.append(name)
            return figure

        return call

    figures = interleaved(
        {"a": variant("a", 1.0), "b": variant("b", 2.0), "c": variant("c", 3.0)}, 3
    )
    assert calls == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    assert figures == {"a": [1.0] * 3, "b": [2.0] * 3, "c": [3.0] * 3}


def test_metric_ratio_is_value_over_baseline_unless_given():
    assert metric("x", 3.0, "s", baseline=4.0)["ratio"] == pytest.approx(0.75)
    assert metric("x", 3.0, "s", baseline=4.0, ratio=0.5)["ratio"] == 0.5
    assert metric("x", 3.0, "s")["ratio"] is None
    assert median([5.0, 1.0, 3.0]) == 3.0
