"""One job of the local stack, run to its end: what the node's watcher does for a job on an
EC2 node (infra/node/templates/watch-jobs.py), for a job on this machine.

`python -m infra.node.local_job FOLDER` is started by the local target's `submit`
(infra/targets/local.py), in a session of its own so that it outlives the command. FOLDER
holds the job as the target wrote it (job.json, train.toml, code/); this runs
`python -m training` on it with the trainer's environment (training/contract.py, ENV),
timestamps its output into FOLDER/output.log, passes a SIGTERM on (the job checkpoints and
exits 75), starts a crashed job again from its checkpoint as the node does (CRASH_RESTARTS
within CRASH_WINDOW_S), and writes the job's end into FOLDER/state.
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from infra.jobs.spool import JobSpec, JobState
from training.contract import (
    CODE_URI_ENV,
    CRASH_RESTARTS,
    CRASH_WINDOW_S,
    ERROR_PREFIX,
    FAILURE_PREFIX,
    ExitCode,
)

SPEC = "job.json"
CONFIG = "train.toml"
CODE = "code"
LOG = "output.log"
STATE = "state"
PID = "pid"
CHECKPOINTS = "checkpoints"
OUTPUT = "output"
# Why the job was sent SIGTERM, written before the signal: `cancel` or `stop`.
CANCEL = "cancel"
STOP = "stop"
# A stop the job answered as asked (exit 75): the state it ends in.
STOPPED_FOR = {CANCEL: JobState.CANCELLED, STOP: JobState.YIELDED}
REASONS = (ERROR_PREFIX, FAILURE_PREFIX)


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


def job_environment(folder: Path, spec: JobSpec) -> dict[str, str]:
    """The trainer's environment for the job in `folder` (names from training/contract.py)."""
    env = {
        **os.environ,
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
        command = [sys.executable, "-m", "training", *spec.trainer_arguments()]
        self.process = subprocess.Popen(
            command,
            env=job_environment(self.folder, spec),
            cwd=self.folder,
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
            if ended is not None:
                write_state(folder, *ended)
                return 0
            log.write(stamp(f"gpu-stack: job {spec.name}: starting it again from its checkpoint"))
            log.flush()


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
