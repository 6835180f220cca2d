"""The local stack's target: this machine, with no Pulumi, no AWS and nothing rented.

`python -m infra run local ...` runs the job here, in the project's environment, with the
same commands as on a rented stack: `jobs`, `logs`, `cancel` (the job checkpoints), `status`,
`stop` and `start`, `down`; a name run again resumes from its checkpoint. Each job is a
folder under the stack's folder (`.local-stack/jobs/<name>`, or $GPU_STACK_LOCAL_DIR):

    job.json      the JobSpec `run` made, as the job spool keeps it on AWS
    train.toml    the training TOML; code/ the `--code` folder, unpacked
    state         the job's state (infra.jobs.spool.JobState) on its first line, then why
    pid           its runner, infra/node/local_job.py, which runs it to its end
    output.log    its output, each line stamped with the UTC time
    checkpoints/  the trainer's checkpoints; output/ its metrics and status.json

This machine runs one job at a time, as a single node does; where a node's newer job makes
the running one yield, here `run` refuses while one runs and names the job to cancel.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from infra.config.stack_file import REPO_ROOT
from infra.deployed import progress, workspace
from infra.deployed.checkpoints import POINTER_NAME, STATUS_NAME
from infra.deployed.leftovers import Leftover
from infra.errors import ConfigError
from infra.jobs import spool
from infra.jobs.spool import JobSpec, JobState
from infra.node import local_job
from infra.outputs import LOCAL, LocalOutputs
from infra.report import format_table
from infra.targets.target import FOLLOW_POLL_S, JobList, ListedJob, Say, Sleep
from training.contract import CPU_WORKERS
from training.environment import TrainerEnv

ROOT_ENV = "GPU_STACK_LOCAL_DIR"  # where the local stack keeps its jobs
# A job checkpoints and exits within seconds of SIGTERM on this machine; a big model's save
# may take minutes.
STOP_WAIT_S = 600
POLL_S = 0.5


def root() -> Path:
    return Path(os.environ.get(ROOT_ENV) or REPO_ROOT / ".local-stack")


def _machine() -> str:
    gpus = local_job.gpus()
    return (
        f"this machine ({os.cpu_count()} CPU cores, {gpus or 'no'} GPU{'s' if gpus != 1 else ''})"
    )


def deployed() -> workspace.Deployed:
    """The local stack: always up, since it is this machine."""
    outputs = LocalOutputs(instance_type=_machine(), checkpoint_uri=str(root() / "jobs"))
    return workspace.Deployed(LOCAL, "this machine", outputs)


@dataclass(frozen=True)
class LocalJob:
    name: str
    folder: Path
    state: JobState
    reason: str
    since: datetime.datetime | None


class LocalTarget:
    """The local stack's jobs, each a folder under the stack's folder (the module says how)."""

    def __init__(self, stack: workspace.Deployed) -> None:
        self.stack = stack
        self.jobs_root = Path(stack.outputs.checkpoint_uri)

    def describe(self) -> str:
        return self.stack.outputs.instance_type

    def up_summary(self) -> str:
        return self.stack.outputs.instance_type

    def ranks(self) -> int:
        """The ranks a trainer job starts here, counted as the launcher counts them."""
        # A bad TRAIN_* value is the trainer's ConfigError, naming the variable.
        return TrainerEnv.from_environ(os.environ).nproc_per_node or local_job.gpus() or CPU_WORKERS

    def store_hf_token(self, environ) -> str:
        return ""  # the job inherits this shell's environment, HF_TOKEN with it

    # ------------------------------------------------------------------ jobs

    def _job(self, name: str) -> LocalJob | None:
        folder = self.jobs_root / name
        if not (folder / local_job.SPEC).is_file():
            return None
        state_file = folder / local_job.STATE
        try:
            word, _, reason = state_file.read_text().partition("\n")
            since = datetime.datetime.fromtimestamp(state_file.stat().st_mtime, datetime.UTC)
        except FileNotFoundError:
            return LocalJob(name, folder, JobState.QUEUED, "", None)
        try:
            state = JobState(word.strip())
        except ValueError:  # not a word the runner writes: never started again by itself
            return LocalJob(name, folder, JobState.FAILED, f"unknown state {word!r}", since)
        if state == JobState.RUNNING and not _alive(folder):
            reason = "its runner is gone (the machine restarted, or it was killed): run it again"
            state = JobState.FAILED
        return LocalJob(name, folder, state, reason.strip(), since)

    def _all(self) -> list[LocalJob]:
        if not self.jobs_root.is_dir():
            return []
        found = (self._job(folder.name) for folder in sorted(self.jobs_root.iterdir()))
        return [job for job in found if job is not None]

    def _running(self) -> list[LocalJob]:
        return [job for job in self._all() if job.state == JobState.RUNNING]

    def submit(self, spec: JobSpec, code: bytes | None) -> str:
        name = self.stack.name
        found = self._job(spec.name)
        if found is not None and found.state == JobState.RUNNING:
            raise ConfigError(
                f"--name {spec.name}: that job is running on {name}; cancel it first "
                f"(`python -m infra cancel {name} {spec.name}`) or pick another"
            )
        busy = self._running()
        if busy:
            raise ConfigError(
                f"job {busy[0].name} is running on {name}, which runs one job at a time: "
                f"cancel it first (`python -m infra cancel {name} {busy[0].name}`, it "
                "checkpoints; `run` with its name resumes it) or wait for it to end"
            )
        local_job.image()  # an image named that cannot run is refused before anything starts
        folder = self.jobs_root / spec.name
        try:
            folder.mkdir(parents=True, exist_ok=True)
            (folder / local_job.SPEC).write_text(spec.model_dump_json(indent=2))
            (folder / local_job.CONFIG).write_text(spec.config_toml)
            (folder / local_job.WORKDIR).write_text(f"{Path.cwd()}\n")
            shutil.rmtree(folder / local_job.CODE, ignore_errors=True)
            if code is not None:
                with tarfile.open(fileobj=io.BytesIO(code), mode="r:gz") as archive:
                    archive.extractall(folder / local_job.CODE, filter="data")
        except OSError as exc:
            raise ConfigError(
                f"cannot write the job's folder {folder} ({exc.strerror}): give the local "
                f"stack a folder you can write with {ROOT_ENV}=FOLDER"
            ) from None
        self._launch(folder)
        said = (
            f"job {spec.name} was {found.state}: it resumes from its last checkpoint"
            if found is not None
            else f"job {spec.name} started"
        )
        return (
            f"{said} on {name}.\nfollow it: python -m infra jobs {name}; "
            f"python -m infra logs {name} --job {spec.name} --follow"
        )

    def _launch(self, folder: Path) -> None:
        for asked in local_job.STOPPED_FOR:
            (folder / asked).unlink(missing_ok=True)
        local_job.write_state(folder, JobState.RUNNING)
        with open(folder / local_job.LOG, "a") as log:
            runner = subprocess.Popen(
                [sys.executable, "-m", "infra.node.local_job", str(folder)],
                cwd=REPO_ROOT,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # outlives this command, and its Ctrl-C
            )
        (folder / local_job.PID).write_text(f"{runner.pid}\n")

    def jobs(self) -> JobList:
        found = self._all()
        notes = [f"job {job.name} failed: {job.reason}" for job in found if job.reason]
        return JobList([ListedJob(job.name, str(job.state), job.since) for job in found], notes)

    def job_status(self, job: str) -> dict | None:
        try:
            return json.loads((self.jobs_root / job / local_job.OUTPUT / STATUS_NAME).read_text())
        except (FileNotFoundError, ValueError):
            return None

    def _stop(self, job: LocalJob, why: str, *, sleep: Sleep, now: Callable[[], float]) -> bool:
        """SIGTERM to the job's runner (it checkpoints); True once it has ended."""
        (job.folder / why).touch()
        # Ended meanwhile: its state says how.
        with contextlib.suppress(ProcessLookupError, ValueError, FileNotFoundError):
            os.kill(_pid(job.folder), signal.SIGTERM)
        deadline = now() + STOP_WAIT_S
        while now() < deadline:
            current = self._job(job.name)
            if current is None or current.state != JobState.RUNNING:
                return True
            sleep(POLL_S)
        return False

    def _checkpoint(self, job: str) -> str:
        """The job's newest committed checkpoint, by the trainer's own pointer."""
        pointer = self.jobs_root / job / local_job.CHECKPOINTS / POINTER_NAME
        return pointer.read_text().strip() if pointer.is_file() else "no checkpoint yet"

    def _stopped_at(self, job: str) -> str:
        status = self.job_status(job)
        if status is None:  # a command job, or a trainer stopped before its first step
            return f"stopped; its saves stay in {self.jobs_root / job / local_job.CHECKPOINTS}"
        return f"stopped at step {status['step']:,}; checkpoint {self._checkpoint(job)}"

    def cancel(self, job: str, *, sleep: Sleep, now: Callable[[], float]) -> str:
        name = self.stack.name
        found = self._job(job)
        if found is None:
            raise ConfigError(f"no job {job!r} on {name}: `python -m infra jobs {name}` lists them")
        if found.state == JobState.YIELDED:  # stopped by `stop`: it leaves the queue
            local_job.write_state(found.folder, JobState.CANCELLED)
            return f"job {job} cancelled: {self._stopped_at(job)}"
        if found.state != JobState.RUNNING:
            return f"job {job} is already {found.state}: nothing to cancel"
        if not self._stop(found, local_job.CANCEL, sleep=sleep, now=now):
            return f"job {job}: cancel requested, still saving after {STOP_WAIT_S} s"
        ended = self._job(job)
        if ended.state != JobState.CANCELLED:
            return f"job {job} ended {ended.state} before the cancel: {ended.reason or 'see logs'}"
        return f"job {job} cancelled: {self._stopped_at(job)}"

    def stop(self, *, say: Say, sleep: Sleep) -> str:
        name, stopped = self.stack.name, []
        for job in self._running():
            if self._stop(job, local_job.STOP, sleep=sleep, now=time.monotonic):
                say(f"job {job.name}: {self._stopped_at(job.name)}")
                stopped.append(job.name)
        if not stopped:
            return f"no job is running on {name}: nothing to stop"
        return (
            f"stopped {', '.join(stopped)} on {name}, checkpointed; "
            f"`python -m infra start {name}` resumes it"
        )

    def start(self, *, say: Say, sleep: Sleep) -> str:
        name = self.stack.name
        waiting = [job for job in self._all() if job.state == JobState.YIELDED]
        if not waiting:
            return f"no job of {name} is stopped: nothing to start (see `python -m infra jobs`)"
        job = max(waiting, key=lambda job: job.since)  # the one `stop` stopped last
        self._launch(job.folder)
        return (
            f"job {job.name} resumes on {name} from checkpoint {self._checkpoint(job.name)}. "
            f"Follow it with `python -m infra logs {name} --follow`."
        )

    # ------------------------------------------------------------------ logs

    def logs(
        self, args: argparse.Namespace, *, out: TextIO, sleep: Sleep, now: Callable[[], float]
    ) -> None:
        name = self.stack.name
        if args.node not in (None, 0):
            raise ConfigError(f"--node {args.node}: stack {name} is one node, node 0")
        if args.job is not None:
            job = spool.check_name(args.job, flag="--job")
            if self._job(job) is None:
                raise ConfigError(
                    f"--job {job}: no job {job!r} on {name}: `python -m infra jobs {name}` "
                    "lists them"
                )
            names = [job]
        else:
            names = [job.name for job in self._all()]
        since = datetime.datetime.fromtimestamp(now() - args.since * 60, datetime.UTC)
        read = dict.fromkeys(names, 0)
        try:
            while True:
                lines = []
                for job in read:
                    with open(self.jobs_root / job / local_job.LOG, "rb") as log:
                        log.seek(read[job])
                        chunk = log.read()
                    whole = chunk[: chunk.rfind(b"\n") + 1]  # a line being written waits
                    read[job] += len(whole)
                    lines += [
                        _parse(job, raw) for raw in whole.decode(errors="replace").split("\n")[:-1]
                    ]
                for when, job, text in sorted(line for line in lines if line[0] >= since):
                    out.write(f"{spool.log_stream(job)}  {when:%H:%M:%S}  {text}\n")
                out.flush()
                if not args.follow:
                    return
                sleep(FOLLOW_POLL_S)
        except KeyboardInterrupt:
            pass

    # ---------------------------------------------------------------- report

    def report(self, now: datetime.datetime) -> str:
        found = self._all()
        lines = [
            f"stack       {self.stack.name}: {self.describe()}, nothing rented ($0.00/h)",
            f"jobs in     {self.jobs_root}",
            f"runs in     {_runs_in()}",
            "",
        ]
        if not found:
            lines.append(
                f"job         none yet: `python -m infra run {self.stack.name} --config JOB.toml`"
            )
            return "\n".join(lines)
        lines += [
            format_table(
                ("JOB", "STATE", "SINCE"),
                [
                    (
                        job.name,
                        str(job.state),
                        f"{job.since:%Y-%m-%d %H:%M} UTC" if job.since else "-",
                    )
                    for job in found
                ],
            ),
            "",
        ]
        newest = max(
            found, key=lambda job: job.since or datetime.datetime.min.replace(tzinfo=datetime.UTC)
        )
        lines.append(
            f"job         {newest.name}: {progress.describe_job(self.job_status(newest.name), now)}"
        )
        lines.append(f"checkpoint  {self._checkpoint(newest.name)}")
        return "\n".join(lines)

    # ---------------------------------------------------------------- down

    def before_destroy(self, *, say: Say, sleep: Sleep) -> None:
        for job in self._running():
            if self._stop(job, local_job.STOP, sleep=sleep, now=time.monotonic):
                say(f"job {job.name}: {self._stopped_at(job.name)}")

    def log_groups(self) -> list[Leftover]:
        return []

    def kept_after_destroy(self) -> list[str]:
        found = self._all()
        if not found:
            return []
        size = sum(p.stat().st_size for p in self.jobs_root.rglob("*") if p.is_file())
        return [f"  {self.jobs_root}: {len(found)} job(s), {size / 2**30:.2f} GiB on this disk"]

    def delete_data(self) -> str:
        """Delete every job's folder (checkpoints, logs); what was deleted, in words."""
        count = len(self._all())
        shutil.rmtree(self.jobs_root, ignore_errors=True)
        return f"deleted {count} job(s) and their checkpoints from {self.jobs_root}"


def _runs_in() -> str:
    named = local_job.image()
    if named is not None:
        return f"the image {named} (docker{', --gpus=all' if local_job.gpus() else ''})"
    return f"this project's environment ({sys.prefix}; ${local_job.IMAGE_ENV} names an image)"


def _pid(folder: Path) -> int:
    return int((folder / local_job.PID).read_text())


def _alive(folder: Path) -> bool:
    """Whether the job's runner is still there (a zombie not yet reaped counts as gone)."""
    try:
        pid = _pid(folder)
    except (FileNotFoundError, ValueError):
        return True  # `run` is writing it: just launched
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _parse(job: str, raw: str) -> tuple[datetime.datetime, str, str]:
    stamp, _, text = raw.partition("  ")
    try:
        when = datetime.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S.%fZ").replace(
            tzinfo=datetime.UTC
        )
    except ValueError:  # a line the runner wrote unstamped (its own traceback)
        return datetime.datetime.max.replace(tzinfo=datetime.UTC), job, raw
    return when, job, text
