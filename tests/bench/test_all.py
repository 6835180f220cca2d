"""`python -m bench all --quick` runs every benchmark end to end and writes a consistent
summary. No figure is asserted against a target: only that each was measured and that
each ratio is the figure over its baseline."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.metadata import version

import pytest
import torch

from bench.suite import BENCHMARKS
from tests.training.multirank import REPO_ROOT, launch_env

# The module's tests read one run (one worker, tests/support/suite_time.py): whichever runs
# first pays for it.
pytestmark = [
    pytest.mark.multiprocess,
    pytest.mark.slow(
        reason="the first test of the module pays for `bench all --quick`: every benchmark's "
        "smallest shape (280 to 475 s measured beside the image build and the Slurm stories)",
        seconds=600,
    ),
]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    done = subprocess.run(
        [sys.executable, "-m", "bench", "all", "--quick", "--out", str(out)],
        cwd=REPO_ROOT,
        env=launch_env(),
        capture_output=True,
        text=True,
        timeout=900,
    )
    errors = [
        f"{entry.stem}: {json.loads(entry.read_text())['error']}"
        for entry in sorted(out.glob("*.json"))
        if "error" in json.loads(entry.read_text())
    ]
    assert done.returncode == 0, "\n".join(errors) + done.stdout[-2000:] + done.stderr[-3000:]
    return out


def test_every_benchmark_ran_or_says_why_not(results):
    index = json.loads((results / "index.json").read_text())
    statuses = {b["name"]: b["status"] for b in index["benchmarks"]}
    assert set(statuses) == set(BENCHMARKS)
    expected_gpu = "ok" if torch.cuda.is_available() else "skipped"
    assert statuses == {name: "ok" for name in BENCHMARKS} | {"gpu": expected_gpu}
    assert index["machine"]["torch"] == version("torch")
    assert index["machine"]["deepspeed"] == version("deepspeed")
    assert index["machine"]["cores"] >= 1 and index["machine"]["cpu"]


def test_each_ratio_is_its_figure_over_its_baseline_and_is_in_the_summary(results):
    summary = (results / "summary.md").read_text()
    for name in BENCHMARKS:
        result = json.loads((results / f"{name}.json").read_text())
        if "skipped" in result:
            assert f"| {result['title']} | not run here |" in summary
            continue
        assert result["metrics"], name
        for row in result["metrics"]:
            if row["value"] is not None and row["baseline"]:
                assert row["ratio"] == pytest.approx(row["value"] / row["baseline"])
            assert f"| {result['title']} | {row['label']} |" in summary
    pngs = list(results.glob("*.png"))
    assert len(pngs) >= 3
    for png in pngs:
        assert png.read_bytes()[:8] == PNG_MAGIC and png.stat().st_size < 100_000
        assert f"]({png.name})" in summary


def test_interruptions_commit_the_step_they_stop_at(results):
    runs = json.loads((results / "interruptions.json").read_text())["runs"]
    for run in runs.values():
        assert run["exit_code"] == 75
        assert run["committed"] == run["stopped_at"] and run["steps_lost"] == 0
        assert 0 < run["to_commit_s"] <= run["to_exit_s"]
    assert runs["spot"]["committed"] > runs["sigterm"]["committed"]  # it resumed, then stopped


def test_startup_phases_add_up_and_memory_partitions(results):
    startup = json.loads((results / "startup.json").read_text())
    for row in startup["metrics"]:
        assert row["value"] >= 0
    phases = startup["phases_s"]["fresh"]
    whole = next(r for r in startup["metrics"] if r["label"] == "fresh: to the first step")
    assert whole["value"] == pytest.approx(sum(phases.values()))

    memory = json.loads((results / "memory.json").read_text())["measured"]["small x2"]
    for rank in memory["ranks"]:
        # ZeRO-2 keeps half the optimizer state per rank on 2 ranks, and all of the params.
        assert rank["ZeRO-2"]["params"] == rank["ZeRO-0"]["params"]
        assert rank["ZeRO-2"]["total"] < rank["ZeRO-0"]["total"]
        assert rank["ZeRO-3"]["params"] == pytest.approx(rank["ZeRO-0"]["params"] / 2, rel=0.01)


def test_the_interrupted_run_reports_its_goodput_against_the_uninterrupted_one(results):
    runs = json.loads((results / "goodput.json").read_text())["runs"]
    clean, stopped = runs["uninterrupted"], runs["interrupted"]
    # The quick shape: killed once (-9) between two checkpoints, then run to the end.
    assert clean["exits"] == [0] and stopped["exits"] == [-9, 0]
    assert len(stopped["attempts"]) == 2
    assert 0 < stopped["run"]["goodput"] < clean["run"]["goodput"] < 1
    assert stopped["run"]["recomputed_s"] > 0 == clean["run"]["recomputed_s"]
