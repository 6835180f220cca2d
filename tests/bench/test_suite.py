"""`python -m bench summary` writes the summary again from the results on disk."""

from __future__ import annotations

import json

from bench.__main__ import main
from bench.measure import metric
from tests.bench.test_report import MACHINE


def test_summary_is_rewritten_from_the_json_results(tmp_path):
    index = {
        "machine": MACHINE,
        "quick": False,
        "finished_at": "2026-01-01T00:00:00Z",
        "benchmarks": [
            {"name": "overhead", "file": "overhead.json", "status": "ok"},
            {"name": "gpu", "file": "gpu.json", "status": "failed"},
        ],
    }
    overhead = {
        "name": "overhead", "title": "Trainer overhead", "baseline": "raw", "setup": "2 ranks",
        "metrics": [metric("trainer", 99.0, "tokens/s", baseline=100.0, baseline_label="raw",
                           target=">= 0.98")],
    }  # fmt: skip
    gpu = {"name": "gpu", "title": "GPU", "error": "RuntimeError: no wheel"}
    for name, content in (("index", index), ("overhead", overhead), ("gpu", gpu)):
        (tmp_path / f"{name}.json").write_text(json.dumps(content))
    assert main(["summary", "--out", str(tmp_path)]) == 0
    summary = (tmp_path / "summary.md").read_text()
    assert (
        "| Trainer overhead | trainer | 99 tokens/s | raw: 100 tokens/s | 0.99 | >= 0.98 |"
        in summary
    )
    assert "| GPU | failed (see below) |" in summary and "RuntimeError: no wheel" in summary
    assert (tmp_path / "overhead.png").is_file()
