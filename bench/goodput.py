"""Goodput: one CPU run stopped three times (SIGTERM, a spot notice, kill -9) vs the same run
uninterrupted.

Real jobs (`python -m training`, launcher and 2 gloo ranks, asynchronous checkpoints every
CHECKPOINT_EVERY steps). The interrupted run gets SIGTERM, then (restarted) a spot notice
through a loopback IMDSv2 (tests/training/fake_imds.py), then (restarted) SIGKILL of the
launcher, whose ranks die with it; a last start trains to the end. The run's goodput and
its parts are what the trainer itself wrote to goodput.json, every start together; the
time between starts (the restart itself) belongs to no start and is not counted.
"""

from __future__ import annotations

import json
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from bench.launch import QUIET, training_command, training_env
from bench.measure import metric
from tests.training.fake_imds import FakeImds
from training.goodput import GOODPUT_FILE

TITLE = "Goodput"
RANKS = 2
# At least this many steps of each start are trained before it is interrupted (not a multiple
# of the checkpoint interval: the kill -9 then loses steps to recompute).
STEPS_BEFORE_INTERRUPTION = 15
# (steps, a checkpoint every, the step after which each interruption comes: kill -9
# between two checkpoints, so that steps are recomputed).
FULL = (300, 25, (("SIGTERM", 60), ("spot notice", 130), ("kill -9", 215)))
# The smallest shape: the one interruption that loses steps (SIGTERM and the spot notice save
# the step they stop at: bench/interruptions.py measures them).
QUICK = (60, 10, (("kill -9", 25),))


def run(quick: bool) -> dict:
    steps, every, interruptions = QUICK if quick else FULL
    options = (f"train.steps={steps}", f"checkpoint.every_steps={every}",
               "logging.every_steps=1", *QUIET)  # fmt: skip
    work = Path(tempfile.mkdtemp(prefix="bench-goodput-"))
    clean = _run(work / "uninterrupted", options, ())
    stopped = _run(work / "interrupted", options, interruptions)
    c, s = clean["run"], stopped["run"]
    metrics = [
        metric(f"interrupted run ({_kinds(interruptions)}): goodput", s["goodput"], "",
               baseline=c["goodput"], baseline_label="uninterrupted"),
        metric("interrupted run: wall time", s["wall_s"], "s", baseline=c["wall_s"],
               baseline_label="uninterrupted", higher_is_better=False),
        metric("interrupted run: start-up", s["startup_s"], "s", baseline=c["startup_s"],
               baseline_label="uninterrupted", higher_is_better=False),
        metric("interrupted run: steps recomputed after the kill", s["recomputed_s"], "s"),
        metric("interrupted run: blocked by checkpoints", s["checkpoint_s"], "s",
               baseline=c["checkpoint_s"], baseline_label="uninterrupted",
               higher_is_better=False),
    ]  # fmt: skip
    return {
        "baseline": "the same job run once, uninterrupted",
        "setup": f"demo job, {steps} steps, {RANKS} gloo ranks, a checkpoint every "
        f"{every} steps (asynchronous), stops after steps "
        + ", ".join(f"{step} ({how})" for how, step in interruptions),
        "metrics": metrics,
        "runs": {"uninterrupted": clean, "interrupted": stopped},
        "notes": [
            _note(name, r) for name, r in (("uninterrupted", clean), ("interrupted", stopped))
        ],
    }


def _kinds(interruptions) -> str:
    return ", ".join(how for how, _ in interruptions)


def _note(name: str, result: dict) -> str:
    run = result["run"]
    parts = ("productive", "startup", "checkpoint", "recomputed", "data_wait", "other")
    return (
        f"{name}: goodput {100 * run['goodput']:.1f}% over {run['wall_s']:.1f} s in "
        f"{len(result['attempts'])} start(s); "
        + ", ".join(f"{part.replace('_', ' ')} {run[f'{part}_s']:.1f} s" for part in parts)
        + f"; exits {result['exits']}"
    )


def _run(work: Path, options: tuple[str, ...], interruptions) -> dict:
    """Start the job until it is done, interrupting it as told; goodput.json and exits."""
    work.mkdir(parents=True)
    exits = []
    with FakeImds() as imds:
        env = training_env(work, RANKS, TRAIN_SPOT_ENDPOINT=imds.url)
        for how, after in [*interruptions, ("none", None)]:
            exits.append(_start(work, options, env, imds, how, after))
            imds.notice = None  # the next start sees no notice
    if exits[-1] != 0:
        raise RuntimeError(f"the last start exited {exits[-1]}:\n{_log(work)[-3000:]}")
    saved = json.loads((work / "out" / GOODPUT_FILE).read_text())
    return {**saved, "exits": exits}


def _start(work: Path, options, env: dict, imds: FakeImds, how: str, after: int | None) -> int:
    resumed_at = _last_step(work)
    with open(work / "job.log", "a") as log:
        job = subprocess.Popen(
            training_command(options), cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT
        )
        try:
            if after is not None:
                # A stop lands where the trainer noticed it, so a start may resume past the
                # planned step: interrupt it a few steps into its own training all the same.
                after = max(after, resumed_at + STEPS_BEFORE_INTERRUPTION)
                while _last_step(work) < after:
                    if job.poll() is not None:
                        raise RuntimeError(f"ended before step {after}:\n{_log(work)[-3000:]}")
                    time.sleep(0.01)
                if how == "SIGTERM":
                    job.send_signal(signal.SIGTERM)
                elif how == "spot notice":
                    imds.notify("terminate", "2026-01-01T00:02:00Z")
                else:
                    job.send_signal(signal.SIGKILL)  # the ranks die with the launcher
            return job.wait(timeout=900)
        finally:
            if job.poll() is None:
                job.kill()


def _last_step(work: Path) -> int:
    path = work / "out" / "metrics.jsonl"
    if not path.is_file():
        return 0
    for line in reversed(path.read_text().splitlines()):
        try:
            return json.loads(line)["step"]
        except ValueError:
            continue  # a line being written
    return 0


def _log(work: Path) -> str:
    return (work / "job.log").read_text()
