"""Starting real jobs: `python -m training` (launcher and ranks) and bench workers."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import torch.distributed as dist

from training.contract import WORKER_VARIABLES

REPO_ROOT = Path(__file__).resolve().parents[1]
# The demo job made quiet: rank 0 writes no progress bar and no TensorBoard unless asked.
QUIET = ("logging.progress_bar=false", "logging.tensorboard=false")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def job_env(**extra: str) -> dict[str, str]:
    """This environment without rank variables, the repo importable, one thread per rank.

    DeepSpeed's JIT ops are cached per interpreter: torch's default cache
    (~/.cache/torch_extensions) is shared by every venv of the user, and a build from
    another venv's paths is rebuilt (about 40 s on 2 cores), which would land in whichever
    benchmark starts next. bench/startup.py measures that cold build on its own.
    """
    env = {k: v for k, v in os.environ.items() if k not in WORKER_VARIABLES}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("TORCH_EXTENSIONS_DIR", str(Path(sys.prefix) / "torch_extensions"))
    env.update(extra)
    return env


def training_command(overrides: list[str] | tuple[str, ...]) -> list[str]:
    return [sys.executable, "-m", "training", *(a for o in overrides for a in ("--set", o))]


def training_env(work: Path, ranks: int, **extra: str) -> dict[str, str]:
    """The environment of a `python -m training` job whose outputs go under ``work``.

    Its temporary files go where this process keeps its own (under `bench all`, the
    benchmark's scratch folder, removed after it): a job a benchmark kills cannot remove
    them itself."""
    return job_env(
        TRAIN_OUTPUT_DIR=str(work / "out"),
        TRAIN_CHECKPOINT_DIR=str(work / "ckpt"),
        TRAIN_NPROC_PER_NODE=str(ranks),
        TRAIN_MASTER_PORT=str(free_port()),
        **{"TRAIN_SPOT_ENDPOINT": "", "TMPDIR": tempfile.gettempdir(), **extra},
    )


def run_training(work: Path, ranks: int, overrides, *, timeout: float = 600, **env: str):
    """Run a job to its end; the completed process (output captured)."""
    work.mkdir(parents=True, exist_ok=True)
    return subprocess.run(
        training_command(overrides),
        cwd=work,
        env=training_env(work, ranks, **env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run_ranks(module: str, ranks: int, args: list[str], *, timeout: float = 600):
    """`python -m module args` on ``ranks`` local ranks through torch's elastic launcher.

    Its per-launch folder (--log-dir) is a temporary one removed here: without it, torch
    leaves a torchelastic_* folder in /tmp for every launch."""
    with tempfile.TemporaryDirectory(prefix="bench-ranks-") as logs:
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nproc_per_node={ranks}",
            "--master_addr=127.0.0.1",
            f"--master_port={free_port()}",
            f"--log-dir={logs}",
            "-m",
            module,
            *args,
        ]
        result = subprocess.run(
            command, cwd=REPO_ROOT, env=job_env(), capture_output=True, text=True, timeout=timeout
        )
    if result.returncode != 0:
        # torchrun ends stderr with its own banner: name the workers' error first.
        named = [line for line in result.stderr.splitlines() if "Error" in line]
        first = named[0].strip() if named else f"exit {result.returncode}"
        raise RuntimeError(f"{module} on {ranks} ranks failed: {first}\n{result.stderr[-3000:]}")
    return result


def exit_worker() -> None:
    """End a bench rank once its results are written, as the trainer's workers end.

    Interpreter shutdown with a live communication backend can abort the process
    ("terminate called without an active exception", SIGABRT) after the work is done;
    the trainer's workers skip it the same way (training/cli.py).
    """
    dist.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
