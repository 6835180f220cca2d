"""One job of the local stack, run to its end: what the node's watcher does for a job on an
EC2 node (infra/node/templates/watch-jobs.py), for a job on this machine.

`python -m infra.node.local_job FOLDER` is started by the local target's `submit`
(infra/targets/local.py), in a session of its own so that it outlives the command. FOLDER
holds the job as the target wrote it (job.json, train.toml, code/); this runs
`python -m training` on it with the trainer's environment (training/contract.py, ENV),
timestamps its output into FOLDER/output.log, passes a SIGTERM on (the job checkpoints and
exits 75), starts a crashed job again from its checkpoint as the node does (CRASH_RESTARTS
within CRASH_WINDOW_S), and writes the job's end into FOLDER/state.

The job runs in this project's environment, or, when $GPU_STACK_LOCAL_IMAGE names an image
and docker is on PATH, in that image as a node runs it: `docker run --gpus all` when this
machine has a GPU, FOLDER mounted at its own path, as this user. A SIGTERM reaches the
container's process through `docker run`, which passes the signals it receives on to it
(--sig-proxy, true by default: docs.docker.com/reference/cli/docker/container/run).
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from infra.errors import ConfigError
from infra.jobs.spool import JobSpec, JobState
from training.contract import (
    CODE_URI_ENV,
    CRASH_RESTARTS,
    CRASH_WINDOW_S,
    ERROR_PREFIX,
    FAILURE_PREFIX,
    HF_HOME_ENV,
    HF_TOKEN_ENV,
    ExitCode,
)

SPEC = "job.json"
CONFIG = "train.toml"
CODE = "code"
LOG = "output.log"
STATE = "state"
PID = "pid"
WORKDIR = "workdir"  # where `run` was typed: the job's relative paths start there
CHECKPOINTS = "checkpoints"
OUTPUT = "output"
# Why the job was sent SIGTERM, written before the signal: `cancel` or `stop`.
CANCEL = "cancel"
STOP = "stop"
# A stop the job answered as asked (exit 75): the state it ends in.
STOPPED_FOR = {CANCEL: JobState.CANCELLED, STOP: JobState.YIELDED}
REASONS = (ERROR_PREFIX, FAILURE_PREFIX)
IMAGE_ENV = "GPU_STACK_LOCAL_IMAGE"  # the image jobs run in, when docker is here
ENV_FILE = "job.env"  # the container's environment (docker run --env-file)


def stamp(line: str, when: float | None = None) -> str:
    """A line of output.log: the UTC time to the millisecond, two spaces, the line."""
    instant = datetime.datetime.fromtimestamp(time.time() if when is None else when, datetime.UTC)
    return f"{instant:%Y-%m-%dT%H:%M:%S.%f}"[:-3] + "Z  " + line.rstrip("\n") + "\n"


def write_state(folder: Path, state: JobState, reason: str = "") -> None:
    partial = folder / f".{STATE}.partial"
    partial.write_text(f"{state}\n{reason}\n" if reason else f"{state}\n")
    os.replace(partial, folder / STATE)


def _free_port() -> int:
    """A port for the job's rendezvous: two jobs, or a job and a test, never share one."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def job_variables(folder: Path, spec: JobSpec) -> dict[str, str]:
    """What the job in `folder` is told beyond the environment it inherits (names from
    training/contract.py): its paths, price and rendezvous port."""
    env = {
        "TRAIN_CHECKPOINT_DIR": str(folder / CHECKPOINTS),
        "TRAIN_OUTPUT_DIR": str(folder / OUTPUT),
        "TRAIN_USD_PER_HOUR": f"{spec.usd_per_hour:.4f}",
        "TRAIN_MASTER_PORT": str(_free_port()),
        "PYTHONUNBUFFERED": "1",
    }
    if not spec.command:
        env["TRAIN_CONFIG"] = str(folder / CONFIG)
    if spec.has_code:
        env[CODE_URI_ENV] = str(folder / CODE)
    return env


def gpus() -> int:
    """This machine's GPUs, as nvidia-smi lists them (none without the driver)."""
    if not shutil.which("nvidia-smi"):
        return 0
    listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False)
    return sum(line.startswith("GPU ") for line in listed.stdout.splitlines())


def image() -> str | None:
    """The image jobs run in ($GPU_STACK_LOCAL_IMAGE), None for this project's environment;
    ConfigError when one is named and docker is not on PATH to run it."""
    named = os.environ.get(IMAGE_ENV, "").strip()
    if named and not shutil.which("docker"):
        raise ConfigError(
            f"{IMAGE_ENV}={named} names an image, and docker is not on PATH to run it: "
            f"install Docker, or unset {IMAGE_ENV} to run jobs in this environment"
        )
    return named or None


def job_command(folder: Path, spec: JobSpec, variables: dict[str, str]) -> list[str]:
    """The job's command line: the trainer here, or in the image as a node runs it."""
    trainer = ["python", "-m", "training", *spec.trainer_arguments()]
    named = image()
    if named is None:
        return [sys.executable, *trainer[1:]]
    # Inside, the job writes only under its folder: caches too (the image's HOME may be
    # another user's), and HF_TOKEN passes by name, never on a command line.
    inside = {
        **{key: value for key, value in os.environ.items() if key.startswith("TRAIN_")},
        **variables,
        "TRAIN_CACHE_DIR": str(folder / "cache"),
        HF_HOME_ENV: str(folder / "hf"),
    }
    (folder / ENV_FILE).write_text("".join(f"{key}={value}\n" for key, value in inside.items()))
    options = ["--rm", "--ipc=host", "--network=host", f"--user={os.getuid()}:{os.getgid()}"]
    if gpus():
        options.append("--gpus=all")
    if os.environ.get(HF_TOKEN_ENV):
        options += ["--env", HF_TOKEN_ENV]
    options += [
        f"--env-file={folder / ENV_FILE}",
        f"--volume={folder}:{folder}",
        f"--workdir={folder}",
    ]
    return ["docker", "run", *options, named, *trainer]


class Run:
    """The job's current process, and the SIGTERM a stop sends it."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.process: subprocess.Popen | None = None
        self.stopping = False
        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGINT, self._stop)

    def _stop(self, signum, frame) -> None:
        self.stopping = True
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)

    def once(self, spec: JobSpec, log) -> tuple[int, str]:
        """Run the job once: its exit status, and the last line that said why it failed."""
        variables = job_variables(self.folder, spec)
        self.process = subprocess.Popen(
            job_command(self.folder, spec, variables),
            env={**os.environ, **variables},
            cwd=_workdir(self.folder),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        if self.stopping:  # asked to stop while it was starting
            self.process.send_signal(signal.SIGTERM)
        reason = ""
        for raw in self.process.stdout:
            # A progress bar redraws its line after each \r: its last drawing is the line.
            line = raw.decode(errors="replace").rstrip("\r\n").rsplit("\r", 1)[-1]
            log.write(stamp(line))
            log.flush()
            if line.startswith(REASONS):
                reason = line.strip().split(" ", 1)[-1]
        return self.process.wait(), reason


def _workdir(folder: Path) -> Path:
    """Where `run` was typed (a TOML's relative data path means the same as there), while
    it exists; else the job's folder. In an image the job sees its folder only."""
    typed = folder / WORKDIR
    where = Path(typed.read_text().strip()) if typed.is_file() else folder
    return where if where.is_dir() and image() is None else folder


def outcome(folder: Path, status: int, reason: str, crashes: list[float]) -> tuple | None:
    """(state, reason) the job ends in after exit `status`; None: start it again."""
    if status == ExitCode.DONE:
        return JobState.DONE, ""
    asked = next((why for why in STOPPED_FOR if (folder / why).exists()), None)
    if asked is not None and status in (ExitCode.INTERRUPTED, ExitCode.CANCELLED):
        return STOPPED_FOR[asked], ""
    if status == ExitCode.BAD_CONFIG:
        return JobState.FAILED, reason or f"exit {status}"
    if asked is not None:  # stopped, but not through a checkpoint
        return STOPPED_FOR[asked], f"exit {status} on the stop: it resumes from its last checkpoint"
    # A crash, a hang's restart or a spot notice (75 unasked): again from the checkpoint.
    now = time.monotonic()
    crashes[:] = [t for t in crashes if now - t < CRASH_WINDOW_S]
    crashes.append(now)
    if len(crashes) <= CRASH_RESTARTS:
        return None
    started = f"exit {status}, {len(crashes)} starts within {CRASH_WINDOW_S / 3600:g} h"
    return JobState.FAILED, f"{reason} ({started})" if reason else started


def main(folder: Path) -> int:
    spec = JobSpec.model_validate(json.loads((folder / SPEC).read_text()))
    run, crashes = Run(folder), []
    with open(folder / LOG, "a") as log:
        while True:
            status, reason = run.once(spec, log)
            log.write(stamp(f"gpu-stack: job {spec.name}: exit {status}"))
            ended = outcome(folder, status, reason, crashes)
            if ended is None and run.stopping:  # the runner itself was told to stop
                ended = JobState.YIELDED, "its runner was stopped: `start` or `run` resumes it"
            if ended is not None:
                write_state(folder, *ended)
                return 0
            log.write(stamp(f"gpu-stack: job {spec.name}: starting it again from its checkpoint"))
            log.flush()


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
