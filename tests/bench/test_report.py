"""The summary: one table row per figure, failed and skipped benchmarks said so, PNG plots."""

from __future__ import annotations

from bench import report
from bench.measure import metric

MACHINE = {
    "cpu": "Some CPU", "cores": 4, "cores_usable": 2, "memory_gib": 8.0, "gpu": None,
    "driver": None, "python": "3.11.7", "torch": "2.13.0", "deepspeed": "0.19.8",
}  # fmt: skip
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_summary_has_a_row_per_figure_and_a_plot_per_benchmark_with_ratios(tmp_path):
    results = [
        {"name": "one", "title": "One", "baseline": "b", "setup": "s", "metrics": [
            metric("fast", 2.0, "s", baseline=4.0, baseline_label="base", target="<= 1"),
            metric("count", 3, "steps"),
        ]},
        {"name": "two", "title": "Two", "skipped": "no GPU"},
        {"name": "three", "title": "Three", "error": "Traceback...\nRuntimeError: boom\n"},
    ]  # fmt: skip
    index = {"machine": MACHINE, "quick": True, "finished_at": "2026-01-01T00:00:00Z"}
    summary = report.write(tmp_path, index, results).read_text()
    assert "Some CPU, 2 of 4 cores, 8.0 GiB, no GPU" in summary
    assert "| One | fast | 2 s | base: 4 s | 0.50 | <= 1 |" in summary
    assert "| One | count | 3 steps |  |  |  |" in summary
    assert "| Two | not run here |" in summary and "Not run here: no GPU" in summary
    assert "Failed: `RuntimeError: boom`" in summary
    assert "![One](one.png)" in summary
    assert (tmp_path / "one.png").read_bytes()[:8] == PNG_MAGIC
    assert not (tmp_path / "two.png").exists()
    table = report.table(tmp_path)
    assert table.splitlines()[0].startswith("Machine: Some CPU")
    assert "| One | fast |" in table and "## One" not in table
