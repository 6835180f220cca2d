"""Interruptions: seconds from SIGTERM and from a spot notice to a committed checkpoint and
to exit 75, steps lost, and seconds from a restart to the first resumed step.

Two real jobs (`python -m training`, launcher and 2 gloo ranks, a metrics record every
step). The first starts fresh and gets SIGTERM once it trains. The second is the same
command run again: it resumes (the restart figure, against the first job's fresh start),
then a spot notice arrives through a loopback IMDSv2 (tests/training/fake_imds.py). The
stop figures are set against the window each one has: the 100 s `docker stop --time 100`
the node's unit gives (infra/node/templates/gpu-training.service) and EC2's two-minute
spot warning (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/spot-instance-termination-notices.html).
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
from training.checkpoint.layout import COMMIT_MARKER, parse_step
from training.contract import ExitCode

TITLE = "Interruptions"
RANKS = 2
DOCKER_STOP_S = 100
SPOT_WARNING_S = 120
OPTIONS = (
    "train.steps=1000000",  # ends only through the stop request
    "checkpoint.every_steps=1000000",  # only the stop writes a checkpoint
    "logging.every_steps=1",
    *QUIET,
)


def run(quick: bool) -> dict:
    work = Path(tempfile.mkdtemp(prefix="bench-interruptions-"))
    first = _stopped_run(work, "sigterm", lambda job, imds: job.send_signal(signal.SIGTERM))
    second = _stopped_run(
        work, "spot", lambda job, imds: imds.notify("terminate", "2026-01-01T00:02:00Z")
    )
    metrics = [
        metric("SIGTERM to committed checkpoint", first["to_commit_s"], "s",
               baseline=DOCKER_STOP_S, baseline_label="docker stop grace", higher_is_better=False),
        metric("SIGTERM to exit 75", first["to_exit_s"], "s",
               baseline=DOCKER_STOP_S, baseline_label="docker stop grace", higher_is_better=False),
        metric("spot notice to committed checkpoint", second["to_commit_s"], "s",
               baseline=SPOT_WARNING_S, baseline_label="spot warning", higher_is_better=False),
        metric("spot notice to exit 75", second["to_exit_s"], "s",
               baseline=SPOT_WARNING_S, baseline_label="spot warning", higher_is_better=False),
        metric("restart to first resumed step", second["to_first_step_s"], "s",
               baseline=first["to_first_step_s"], baseline_label="fresh start to first step",
               higher_is_better=False),
        metric("steps lost (SIGTERM + spot)", first["steps_lost"] + second["steps_lost"],
               "steps", target="0", higher_is_better=False),
    ]  # fmt: skip
    return {
        "baseline": "the time each stop has before it is killed; a fresh start for the restart",
        "setup": f"demo job, {RANKS} gloo ranks, a record every step, spot poll every 5 s",
        "metrics": metrics,
        "runs": {"sigterm": first, "spot": second},
        "notes": [
            f"{name}: stopped at step {r['stopped_at']}, committed {r['committed']}, "
            f"exit {r['exit_code']}"
            for name, r in {"SIGTERM": first, "spot notice": second}.items()
        ]
        + ["the spot figure includes up to one poll interval (5 s) before the notice is seen"],
    }


def _stopped_run(work: Path, name: str, trigger) -> dict:
    """Start (or resume) the job, trigger a stop once it trains, time the commit and exit."""
    with FakeImds() as imds:
        env = training_env(work, RANKS, TRAIN_SPOT_ENDPOINT=imds.url if name == "spot" else "")
        metrics_file = work / "out" / "metrics.jsonl"
        seen = _records(metrics_file)
        before = {p.parent.name for p in (work / "ckpt").glob(f"step_*/{COMMIT_MARKER}")}
        log = open(work / f"{name}.log", "w")  # noqa: SIM115 (closed below)
        started = time.monotonic()
        job = subprocess.Popen(
            training_command(OPTIONS), cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT
        )
        try:
            while len(_records(metrics_file)) <= len(seen):
                if job.poll() is not None:
                    raise RuntimeError((work / f"{name}.log").read_text()[-3000:])
                time.sleep(0.02)
            first_step = time.monotonic() - started
            trigger(job, imds)
            stopped = time.monotonic()
            committed_at = None
            while job.poll() is None:
                if committed_at is None and _new_commits(work, before):
                    committed_at = time.monotonic()
                time.sleep(0.02)
            exited = time.monotonic()
            code = job.wait()
        finally:
            if job.poll() is None:
                job.kill()
            log.close()
    commits = sorted(_new_commits(work, before), key=parse_step)
    if code != ExitCode.INTERRUPTED or not commits:
        raise RuntimeError(
            f"{name}: exit {code}, commits {commits}:\n{(work / f'{name}.log').read_text()[-3000:]}"
        )
    committed = parse_step(commits[-1])
    last_trained = _records(metrics_file)[-1]["step"]
    return {
        "to_first_step_s": first_step,
        "to_commit_s": (committed_at or exited) - stopped,
        "to_exit_s": exited - stopped,
        "exit_code": code,
        "stopped_at": last_trained,
        "committed": committed,
        "steps_lost": last_trained - committed,
    }


def _records(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    lines = path.read_text().splitlines()
    records = []
    for line in lines:
        try:
            records.append(json.loads(line))
        except ValueError:
            break  # a line being written
    return records


def _new_commits(work: Path, before: set[str]) -> list[str]:
    return [
        p.parent.name
        for p in (work / "ckpt").glob(f"step_*/{COMMIT_MARKER}")
        if p.parent.name not in before
    ]
