"""Start-up: seconds from `python -m training` to the end of the first training step, split
into launcher, imports, rendezvous, model and data, engine build, op build, checkpoint
load and the first step; once fresh and (full run) once resuming from a checkpoint.

The job is the real launcher and 2 gloo ranks; rank 0's timestamps come from a bench
hook (bench/startup_hook/sitecustomize.py) that wraps the start-up calls and records when
each begins and ends; the trainer itself is unchanged. Each phase is reported as its
share of the whole, and the whole against the 30 s target for the cpu image.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from bench.launch import QUIET, REPO_ROOT, run_training
from bench.measure import metric

TITLE = "Start-up"
RANKS = 2
TARGET_S = 30.0
HOOK = Path(__file__).with_name("startup_hook")
JOB = ("logging.every_steps=1", *QUIET)


def run(quick: bool) -> dict:
    work = Path(tempfile.mkdtemp(prefix="bench-startup-"))
    # Full run: a fresh container's start (empty op cache: DeepSpeed builds its ops), then
    # a restart that resumes from the first job's checkpoint with the ops cached.
    ops = {} if quick else {"TORCH_EXTENSIONS_DIR": str(work / "torch_extensions")}
    starts, ops_built = {}, {}
    for kind, steps in (("fresh", 2), ("resumed", 4))[: 1 if quick else 2]:
        starts[kind], ops_built[kind] = _start(work, kind, steps=steps, **ops)
    shutil.rmtree(work, ignore_errors=True)
    metrics = []
    for kind, phases in starts.items():
        total = sum(phases.values())
        metrics.append(
            metric(f"{kind}: to the first step", total, "s", baseline=TARGET_S,
                   baseline_label="target", target="<= 30 s", higher_is_better=False)
        )  # fmt: skip
        metrics += [
            metric(f"{kind}: {phase}", seconds, "s", baseline=total,
                   baseline_label="share of start-up", higher_is_better=False)
            for phase, seconds in phases.items()
        ]  # fmt: skip
    return {
        "baseline": "the whole start-up (each phase's share), and the 30 s target",
        "setup": f"demo job, {RANKS} gloo ranks, rank 0's timestamps",
        "metrics": metrics,
        "phases_s": starts,
        "ops_loaded": ops_built,
        "notes": [
            f"{kind}: " + ", ".join(f"{k} {v:.1f} s" for k, v in phases.items())
            for kind, phases in starts.items()
        ]
        + [
            f"{kind}: DeepSpeed ops loaded: {', '.join(n) or 'none'}"
            for kind, n in ops_built.items()
        ]
        + [
            "quick runs share the bench's op cache; the full run's fresh start has an empty "
            "one (a venv's first start), the resumed start finds the op built",
            "the cpu image builds deepspeed_shm_comm when it is built (images/build_args.py, "
            "DEEPSPEED_OPS), so a container starts as the op-cached case does",
        ],
    }


def _start(work: Path, kind: str, *, steps: int, **env: str) -> tuple[dict[str, float], list]:
    marks_dir = work / f"marks-{kind}"
    marks_dir.mkdir()
    path = os.pathsep.join(filter(None, [str(HOOK), str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    launched = time.time()
    result = run_training(
        work,
        RANKS,
        (*JOB, f"train.steps={steps}", "checkpoint.every_steps=2"),
        BENCH_STARTUP_DIR=str(marks_dir),
        PYTHONPATH=path,
        **env,
    )
    if result.returncode != 0:
        raise RuntimeError(f"python -m training failed:\n{result.stderr[-3000:]}")
    m = json.loads((marks_dir / "rank0.json").read_text())
    ops = sum(end - begin for begin, end, _ in m["op_builds"])
    # An op built inside a phase (DeepSpeed builds its CPU comm op in init_distributed or
    # initialize) counts as op build, not as that phase.
    in_rendezvous = _overlap(m["op_builds"], m["rendezvous_start"], m["rendezvous_end"])
    in_engine = _overlap(m["op_builds"], m["engine_build_start"], m["engine_build_end"])
    return {
        "launcher": m["process_start"] - launched,
        "interpreter": m["interpreter_ready"] - m["process_start"],
        "imports": m["imports_done"] - m["interpreter_ready"],
        "config and signals": m["rendezvous_start"] - m["imports_done"],
        "rendezvous": m["rendezvous_end"] - m["rendezvous_start"] - in_rendezvous,
        "model and data": m["engine_build_start"] - m["rendezvous_end"],
        "engine build": m["engine_build_end"] - m["engine_build_start"] - in_engine,
        "op build": ops,
        "checkpoint load": m["checkpoint_load_end"] - m["checkpoint_load_start"],
        "first step": m["first_step_end"] - m["checkpoint_load_end"],
    }, sorted({name for _, _, name in m["op_builds"]})


def _overlap(spans: list, start: float, end: float) -> float:
    return sum(max(0.0, min(e, end) - max(b, start)) for b, e, _ in spans)
