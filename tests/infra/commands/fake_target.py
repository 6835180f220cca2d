"""A third kind of stack, in one file: a Target that keeps its jobs in memory, and its
Deployment.

It is what a new kind (Kubernetes, a machine at hand) adds to infra/targets/: one class
with the Target protocol's methods, one with the Deployment protocol's. test_fake_target.py
registers them as the stack's kind and runs every command against them.
"""

from __future__ import annotations

import datetime
from typing import ClassVar

from infra.deployed import workspace
from infra.errors import ConfigError
from infra.jobs.spool import JobSpec
from infra.targets.target import JobList, ListedJob


class FakeTarget:
    # Shared by every instance: each command opens the target anew, as the CLI does.
    queue: ClassVar[dict[str, str]] = {}
    calls: ClassVar[list[str]] = []

    def __init__(self, stack: workspace.Deployed) -> None:
        self.stack = stack

    def describe(self) -> str:
        return "its fake machines"

    def up_summary(self) -> str:
        return "fake machines"

    def submit(self, spec: JobSpec, code: bytes | None) -> str:
        if self.queue.get(spec.name) == "running":
            raise ConfigError(f"--name {spec.name}: that job is running")
        self.queue[spec.name] = "running"
        return f"job {spec.name} queued on the fake stack (code: {code is not None})"

    def store_hf_token(self, environ) -> str:
        return "fake secret stored" if environ.get("HF_TOKEN") else ""

    def jobs(self) -> JobList:
        return JobList([ListedJob(name, state, None) for name, state in self.queue.items()], [])

    def job_status(self, job: str) -> dict | None:
        return {"step": 5, "total_steps": 200, "loss": 2.5, "tokens_per_s": 1000.0}

    def cancel(self, job: str, *, sleep, now) -> str:
        if job not in self.queue:
            raise ConfigError(f"no job {job!r}")
        self.queue[job] = "cancelled"
        return f"job {job} cancelled on the fake stack"

    def stop(self, *, say, sleep) -> str:
        self.calls.append("stop")
        return "fake stack stopped"

    def start(self, *, say, sleep) -> str:
        self.calls.append("start")
        return "fake stack started"

    def logs(self, args, *, out, sleep, now) -> None:
        out.write(f"fake log of {args.job or 'every job'}\n")

    def report(self, now: datetime.datetime) -> str:
        return f"fake stack {self.stack.name}: {len(self.queue)} job(s)"

    def before_destroy(self, *, say, sleep) -> None:
        self.calls.append("before_destroy")
        say("fake jobs checkpointed")

    def log_groups(self) -> list:
        return []

    def kept_after_destroy(self) -> list[str]:
        return ["  a fake volume (kept on purpose)"]


class FakeDeployment:
    calls: ClassVar[list[str]] = []

    def __init__(self, name: str, plan) -> None:
        self.name = name

    def check(self) -> None:
        self.calls.append("check")

    def preview(self, stack, *, say, policy_packs):
        self.calls.append("preview")
        return stack.preview(on_output=say, policy_packs=policy_packs), "a fake note"

    def prepare(self, open_stack, *, say, policy_packs):
        self.calls.append("prepare")
        say("the fake change needs nothing")
        return None

    def up(self, stack, pulumi_up, *, say, sleep):
        self.calls.append("up")
        return pulumi_up()
