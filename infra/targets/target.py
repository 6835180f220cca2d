"""The Target protocol: what the commands do to a running stack, and the values it returns;
the Deployment protocol: what `preview` and `up` do around Pulumi for a kind of stack
(infra/targets/__init__.py says how each is chosen and what each kind's file holds)."""

from __future__ import annotations

import argparse
import datetime
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TextIO

from infra.deployed import workspace
from infra.deployed.checkpoints import job_status
from infra.deployed.leftovers import Leftover
from infra.jobs import hf_token
from infra.jobs.spool import JobSpec

FOLLOW_POLL_S = 3.0  # logs --follow: how often a target looks for new lines

Say = Callable[[str], None]
Sleep = Callable[[float], None]


@dataclass(frozen=True)
class ListedJob:
    """One job as `jobs` lists it."""

    name: str
    state: str  # the target's own words: "running", "pending (slurm 12, 0:42)"
    since: datetime.datetime | None  # when it took that state, where the target knows


@dataclass(frozen=True)
class JobList:
    jobs: list[ListedJob]
    notes: list[str]  # printed under the table: why jobs failed, what was skipped
    # The stack's spend over a job's starts, where one job holds the stack at a time and the
    # spend guard keeps a ledger; None: a job's cost is the trainer's own figure.
    spend_over: Callable[[list], float] | None = None


class StackTarget:
    """What every kind of target keeps: the stack, its bucket (checkpoints, the job spool and
    job code), and AWS clients in the stack's region."""

    def __init__(self, stack: workspace.Deployed) -> None:
        self.stack = stack
        self.bucket = stack.outputs.checkpoint_bucket
        self._clients: dict[str, Any] = {}

    def _aws(self, service: str) -> Any:
        if service not in self._clients:
            self._clients[service] = workspace.aws(service, self.stack.region)
        return self._clients[service]

    def run_uri(self, job: str) -> str:
        """Where job `job` keeps its checkpoints and status.json (a prefix per job name)."""
        raise NotImplementedError

    def job_status(self, job: str) -> dict | None:
        return job_status(self._aws("s3"), self.run_uri(job))

    def store_hf_token(self, environ: Mapping[str, str]) -> str:
        secret = hf_token.secret_name(self.stack.cost_tag[1])
        return hf_token.store(self._aws("secretsmanager"), secret, environ) or ""


class Target(Protocol):
    """What the commands do to a running stack. Each method returns what the command prints
    (or says it through `say`); bad input or an unreachable stack is a ConfigError."""

    stack: workspace.Deployed

    def describe(self) -> str:
        """The stack's compute, in a few words, for a question: "1 node(s)", "its Slurm
        cluster"."""

    def up_summary(self) -> str:
        """What `up` prints of the stack's compute once it is up."""

    def submit(self, spec: JobSpec, code: bytes | None) -> str:
        """Queue job `spec` (with its --code archive); a name run before resumes."""

    def store_hf_token(self, environ: Mapping[str, str]) -> str:
        """HF_TOKEN from `environ`, when set, as the stack's secret (the job reads it at its
        start); the line saying so, "" when there is none."""

    def jobs(self) -> JobList:
        """Every job of the stack."""

    def job_status(self, job: str) -> dict | None:
        """Job `job`'s progress as the trainer publishes it (status.json: step, loss, rate,
        cost), None before it has any."""

    def cancel(self, job: str, *, sleep: Sleep, now: Callable[[], float]) -> str:
        """Stop `job` with a final checkpoint (SIGTERM); it leaves the queue."""

    def stop(self, *, say: Say, sleep: Sleep) -> str:
        """Checkpoint the running jobs and stop paying for GPUs; `start` resumes."""

    def start(self, *, say: Say, sleep: Sleep) -> str:
        """Bring back what `stop` (or the spend guard) stopped; the jobs resume."""

    def logs(
        self, args: argparse.Namespace, *, out: TextIO, sleep: Sleep, now: Callable[[], float]
    ) -> None:
        """Write the jobs' output to `out` (args: job, node, since, follow, as `logs` takes
        them); --follow keeps writing until Ctrl-C."""

    def report(self, now: datetime.datetime) -> str:
        """The stack's status: its machines, its jobs' progress, checkpoints."""

    def before_destroy(self, *, say: Say, sleep: Sleep) -> None:
        """What must happen before `pulumi destroy`: running jobs checkpoint, and nothing
        outside Pulumi is left to start new machines."""

    def log_groups(self) -> list[Leftover]:
        """The stack's log groups that `pulumi destroy` leaves (not the program's own):
        `down` lists them as kept, or deletes them with --delete-data."""

    def kept_after_destroy(self) -> list[str]:
        """Lines naming what this kind leaves in the account on purpose after a destroy,
        beyond the stack's own bucket, repository and log groups."""


class MachineTarget(Target, Protocol):
    """A stack that no Pulumi program makes (the local stack: this machine). `down` stops its
    jobs (before_destroy); nothing is rented, so there is nothing to destroy."""

    def delete_data(self) -> str:
        """Delete the jobs' checkpoints and logs (`down --delete-data`); what, in words."""

    def ranks(self) -> int:
        """How many ranks a trainer job starts with here."""


class Deployment(Protocol):
    """How `preview` and `up` change a stack of one kind: the Pulumi program makes the
    resources; this says what the change means for the kind and does what must happen around
    Pulumi's up. One per `up`, for the stack file's kind."""

    def check(self) -> None:
        """Refuse, in one line (ConfigError), a stack this kind cannot deploy."""

    def preview(self, stack: Any, *, say: Say, policy_packs: list[str]) -> tuple[Any, str]:
        """Pulumi's preview (its result), and what the change means here ("" for nothing)."""

    def prepare(
        self, open_stack: Callable[[], Any], *, say: Say, policy_packs: list[str]
    ) -> Any | None:
        """Before `up` asks: say what the change needs and refuse one that cannot be made. The
        stack, if this had to open it; None when nothing is opened before the yes."""

    def up(self, stack: Any, pulumi_up: Callable[[], Any], *, say: Say, sleep: Sleep) -> Any:
        """Run `pulumi_up` (Pulumi's up) with what this kind does around it; its result."""
