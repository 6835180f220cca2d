"""The benchmarks `python -m bench all` runs, each in its own process, and their outputs.

Each benchmark module has TITLE and run(quick) -> result: a dict with "title", "baseline",
"setup", "metrics" (rows from bench.measure.metric) and whatever else it measured. A
benchmark that cannot run here returns {"skipped": reason}; one that fails is recorded
with its error. No number fails the run: targets are reported, not enforced.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import machine, report
from bench.launch import REPO_ROOT, job_env

BENCHMARKS = (
    "overhead",
    "checkpoints",
    "interruptions",
    "goodput",
    "startup",
    "plan_scale",
    "memory",
    "hf",
    "layouts",
    "image",
    "gpu",
)
DEFAULT_OUT = REPO_ROOT / "bench" / "results"


def run_one(name: str, *, quick: bool, out: Path) -> dict:
    """Run one benchmark in this process and write out/<name>.json. What it writes in
    temporary folders (models, checkpoints, runs) goes with a scratch folder of its own,
    removed when it ends."""
    module = importlib.import_module(f"bench.{name}")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=f"bench-{name}-") as scratch:
        # tempfile's default folder for this process (its documented `tempdir`).
        tempfile.tempdir = scratch
        try:
            measured = module.run(quick)
        finally:
            tempfile.tempdir = None
    result = {"name": name, "title": module.TITLE, **measured}
    result["quick"] = quick
    result["seconds"] = round(time.perf_counter() - started, 1)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    return result


def run_all(names: list[str], *, quick: bool, out: Path, timeout_s: float) -> dict:
    """Each benchmark in a fresh process (so one's DeepSpeed or Pulumi state cannot leak into
    the next), then the index, the plots and the summary."""
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for name in names:
        print(f"bench: {name} ...", file=sys.stderr, flush=True)
        started = time.perf_counter()
        command = [sys.executable, "-m", "bench", name, "--out", str(out)]
        try:
            done = subprocess.run(
                command + (["--quick"] if quick else []),
                cwd=REPO_ROOT,
                env=job_env(),
                capture_output=True,
                text=True,
                timeout=timeout_s,
            )
            error = None if done.returncode == 0 else done.stderr[-2000:]
        except subprocess.TimeoutExpired:
            error = f"did not finish within {timeout_s:.0f} s"
        took = round(time.perf_counter() - started, 1)
        if error is None:
            results.append(json.loads((out / f"{name}.json").read_text()))
        else:
            failed = {"name": name, "title": _title(name), "error": error, "seconds": took}
            (out / f"{name}.json").write_text(json.dumps(failed, indent=1) + "\n")
            results.append(failed)
        print(f"bench: {name} {'done' if error is None else 'FAILED'} in {took} s", file=sys.stderr)
    index = {
        "machine": machine.describe(),
        "quick": quick,
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "benchmarks": [
            {"name": r["name"], "file": f"{r['name']}.json", "status": _status(r)} for r in results
        ],
    }
    (out / "index.json").write_text(json.dumps(index, indent=1) + "\n")
    report.write(out, index, results)
    return index


def rewrite_summary(out: Path) -> Path:
    """summary.md and the plots again, from index.json and the results beside it."""
    index = json.loads((out / "index.json").read_text())
    results = []
    for entry in index["benchmarks"]:
        results.append(json.loads((out / entry["file"]).read_text()))
    return report.write(out, index, results)


def _title(name: str) -> str:
    return importlib.import_module(f"bench.{name}").TITLE


def _status(result: dict) -> str:
    if "error" in result:
        return "failed"
    return "skipped" if "skipped" in result else "ok"
