"""Running real `python -m training` jobs (launcher + 2 gloo ranks) from tests."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tests.training.multirank import REPO_ROOT, free_port, launch_env

# A tiny fp32 job: the demo config made smaller, a metrics record every step. Dropout is
# on, so a resumed run only matches if the RNG state came back; 120 samples are 15 steps
# of 2 ranks x 4, so a run crosses epoch boundaries.
TINY = (
    "data.seq_len=32",
    "data.vocab_size=64",
    "data.synthetic_samples=120",
    "model.dropout=0.1",
    "train.micro_batch_size=4",
    "train.steps=40",
    "optimizer.lr=3e-3",
    "optimizer.weight_decay=0.0",
    "scheduler.kind=constant",
    "scheduler.warmup_steps=2",
    "logging.every_steps=1",
    "logging.progress_bar=false",
    "logging.tensorboard=false",
)
STEPS = 40

# The same without dropout, 12 steps, a checkpoint at step 6, and the global batch fixed,
# so that jobs with other micro-batch or world sizes see the same batches.
NO_DROPOUT = (
    *TINY,
    "zero.stage=2",
    "model.dropout=0",
    "train.steps=12",
    "train.global_batch_size=8",
    "checkpoint.every_steps=6",
)

_shared: dict[tuple[str, ...], Job] = {}


def shared_run(tmp_path_factory, *overrides: str) -> Job:
    """A finished job that several tests read (launched once per test session)."""
    if overrides not in _shared:
        job = run_job(tmp_path_factory.mktemp("job"), *overrides)
        assert job.returncode == 0, job.stderr[-3000:]
        _shared[overrides] = job
    return _shared[overrides]


@dataclass
class Job:
    returncode: int
    stdout: str
    stderr: str
    output_dir: Path

    @property
    def metrics(self) -> list[dict]:
        return read_metrics(self.output_dir)

    @property
    def losses(self) -> list[float]:
        return [record["loss"] for record in self.metrics]


def read_metrics(output_dir: Path) -> list[dict]:
    path = output_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def job_command(*overrides: str, config: Path | None = None) -> list[str]:
    args = [arg for override in overrides for arg in ("--set", override)]
    if config is not None:
        args = ["--config", str(config), *args]
    return [sys.executable, "-m", "training", *args]


def job_env(output_dir: Path, **extra: str) -> dict[str, str]:
    defaults = {
        "TRAIN_OUTPUT_DIR": str(output_dir),
        "TRAIN_MASTER_PORT": str(free_port()),
        "TRAIN_SPOT_ENDPOINT": "",  # no metadata service here: do not poll one
    }
    return launch_env(**{**defaults, **extra})


def start_job(
    output_dir: Path, *overrides: str, config: Path | None = None, **popen
) -> subprocess.Popen:
    popen.setdefault("env", job_env(output_dir))
    popen.setdefault("cwd", REPO_ROOT)
    return subprocess.Popen(
        job_command(*overrides, config=config),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **popen,
    )


def run_job(
    output_dir: Path, *overrides: str, config: Path | None = None, timeout: float = 240, **popen
) -> Job:
    process = start_job(output_dir, *overrides, config=config, **popen)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        stdout, stderr = process.communicate()
        raise AssertionError(f"job did not finish in {timeout} s:\n{stderr[-3000:]}") from None
    return Job(process.returncode, stdout, stderr, output_dir)


def wait_while_running(condition, job: subprocess.Popen, what: str, timeout_s: float = 180) -> None:
    """Until ``condition()`` holds; fails if the job ends first or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert job.poll() is None, f"exited before {what}: {job.communicate()[1][-3000:]}"
        assert time.monotonic() < deadline, f"never saw {what}"
        time.sleep(0.05)
