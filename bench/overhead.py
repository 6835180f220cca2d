"""Trainer overhead: tokens/s of `python -m training` vs a hand-written DeepSpeed loop and a
plain PyTorch loop, same model, data, DeepSpeed config and ranks (bench/loops.py).

The trainer's figure is its own metrics (step_time_s per logging window, the first window
left out as warm-up); the loops time windows of the same length. Trainer and loop jobs
alternate (trainer, loops, trainer, ...): separate processes, so this ratio carries the
machine's noise between jobs. The cost of each per-step extra of the trainer is timed
call by call inside one loop job and set against that job's median step, which is steady.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from bench.launch import QUIET, run_ranks, run_training
from bench.measure import interleaved, median, metric
from training.spec.config import load_config, validate

TITLE = "Trainer overhead"
RANKS = 2
# The demo job (tiny GPT, synthetic data, ZeRO-2): the smallest step, where fixed
# per-step work weighs most.
JOB = ("checkpoint.every_steps=1000000",)
EXTRAS = {
    "stop_flag": "stop-flag all-reduce + host sync (every step)",
    "loss_window": "loss averaged over ranks (every logging window)",
    "sampler": "resumable sampler vs DistributedSampler",
}


def run(quick: bool) -> dict:
    window, windows, jobs = (10, 3, 1) if quick else (10, 8, 3)
    overrides = (*JOB, f"logging.every_steps={window}")
    trainers = {"trainer": (), "trainer, outputs off": QUIET}
    if quick:
        del trainers["trainer, outputs off"]
    runs: dict[str, list[float]] = {name: [] for name in trainers}
    loop_runs: list[dict] = []
    work = Path(tempfile.mkdtemp(prefix="bench-overhead-"))

    def trainer(name: str):
        def once() -> None:
            folder = work / f"trainer-{len(runs[name])}-{len(trainers[name])}"
            steps = window * (windows + 1)
            result = run_training(
                folder, RANKS, (*overrides, *trainers[name], f"train.steps={steps}"), timeout=900
            )
            if result.returncode != 0:
                raise RuntimeError(f"python -m training failed:\n{result.stderr[-3000:]}")
            records = [json.loads(line) for line in (folder / "out" / "metrics.jsonl").open()]
            runs[name].extend(r["step_time_s"] * window for r in records[1:])

        return once

    def loops() -> None:
        out = work / f"loops-{len(loop_runs)}.json"
        options = [a for o in overrides for a in ("--set", o)]
        rounds = [f"--window={window}", f"--rounds={windows}", f"--calls={10 if quick else 40}"]
        run_ranks("bench.loops", RANKS, [*options, *rounds, f"--out={out}"], timeout=900)
        loop_runs.append(json.loads(out.read_text()))

    interleaved({**{name: trainer(name) for name in trainers}, "loops": loops}, jobs)

    for name in ("deepspeed", "pytorch"):
        runs[name] = [s for r in loop_runs for s in r["seconds_per_window"][name]]
    seconds = {name: median(values) for name, values in runs.items()}
    config = load_config(None, overrides, env={})
    tokens = validate(config, RANKS).global_batch_size * config.data.seq_len * window
    rate = {name: tokens / s for name, s in seconds.items()}
    raw = "raw DeepSpeed loop"
    metrics = [
        metric("trainer (python -m training)", rate["trainer"], "tokens/s",
               baseline=rate["deepspeed"], baseline_label=raw, target=">= 0.98"),
    ]  # fmt: skip
    if "trainer, outputs off" in rate:
        metrics.append(
            metric("trainer, TensorBoard and progress bar off", rate["trainer, outputs off"],
                   "tokens/s", baseline=rate["deepspeed"], baseline_label=raw)
        )  # fmt: skip
    metrics.append(
        metric("raw DeepSpeed loop", rate["deepspeed"], "tokens/s",
               baseline=rate["pytorch"], baseline_label="plain PyTorch (DDP) loop")
    )  # fmt: skip
    # Each extra's share of a step: its median call time x calls per step, over the
    # median raw step of the same job.
    costs = {}
    for extra in EXTRAS:
        shares = [
            r["seconds_per_call"][extra]
            * r["calls_per_step"][extra]
            / (median(r["seconds_per_window"]["deepspeed"]) / r["window_steps"])
            for r in loop_runs
        ]
        costs[extra] = {
            "ms_per_call": 1000 * median([r["seconds_per_call"][extra] for r in loop_runs]),
            "share_of_step": median(shares),
        }
    metrics += extra_rows(costs, seconds["deepspeed"] / window)
    return {
        "baseline": "a hand-written DeepSpeed loop on the same model, config and ranks",
        "setup": (
            f"demo job (tiny GPT, seq 64, vocab 128, ZeRO-2, fp32), {RANKS} gloo ranks, "
            f"{window}-step windows; medians of {len(runs['trainer'])} trainer and "
            f"{len(runs['deepspeed'])} loop windows from {jobs} job(s) each"
        ),
        "metrics": metrics,
        "seconds_per_window": runs,
        "extras": costs,
        "notes": [
            f"{label}: {costs[extra]['ms_per_call']:.3f} ms per call, "
            f"{100 * costs[extra]['share_of_step']:.2f}% of a step"
            for extra, label in EXTRAS.items()
        ]
        + [
            "trainer and loop figures come from separate jobs, whose ratios swing by tens of "
            "percent on a shared machine; the per-call timings come from inside one job"
        ],
    }


def extra_rows(costs: dict, raw_step_s: float) -> list[dict]:
    """One row per extra: the raw step with that extra's cost added, against the raw step."""
    return [
        metric(f"raw loop + {label}", 1000 * raw_step_s * (1 + costs[extra]["share_of_step"]),
               "ms/step", baseline=1000 * raw_step_s, baseline_label="raw DeepSpeed step",
               target="<= 1.01", higher_is_better=False)
        for extra, label in EXTRAS.items()
    ]  # fmt: skip
