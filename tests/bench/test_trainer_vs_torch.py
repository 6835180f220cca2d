"""The benchmark runs end to end on CPU and writes a consistent report (no speed asserted)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.training.multirank import REPO_ROOT, launch_env


@pytest.mark.multiprocess
@pytest.mark.slow(
    reason="both training loops, each in its own processes, on the same batches", seconds=70
)
def test_bench_reports_both_loops_and_their_ratio(tmp_path):
    out = tmp_path / "report.json"
    small = [
        "--vocab",
        "256",
        "--seq-len",
        "32",
        "--micro-batch",
        "2",
        "--steps",
        "4",
        "--warmup",
        "1",
        "--rounds",
        "2",
    ]
    result = subprocess.run(
        [sys.executable, "-m", "bench.trainer_vs_torch", *small, "--out", str(out)],
        cwd=REPO_ROOT,
        env=launch_env(OMP_NUM_THREADS="1"),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["timed_steps"] == 4 and report["zero_stage"] == 2
    assert report["pytorch_tokens_per_s"] > 0 and report["deepspeed_tokens_per_s"] > 0
    assert report["tokens_per_s_ratio_deepspeed_over_pytorch"] == pytest.approx(
        report["deepspeed_tokens_per_s"] / report["pytorch_tokens_per_s"]
    )
    assert "ratio" in result.stdout
    # No GPU peak on CPU: MFU is reported as unknown, never as a made-up figure.
    assert report["pytorch_mfu"] is None and report["deepspeed_mfu"] is None
