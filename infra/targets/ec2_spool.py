"""The single-node stack's target (gpu:cluster unset): EC2 nodes that read a job spool.

Jobs go into the job spool in the stack's bucket (infra/jobs/spool.py), where the node's
watcher finds them within seconds; a running job checkpoints and yields to a new one (exit
75), then resumes once it ends (docs/stack.md, "Jobs"). A cancel is a `cancel` object in
the spool: the watcher stops the container (SIGTERM, the job checkpoints and exits 75) and
marks the job cancelled. `stop` stops the job through SSM, then the instances; each job
logs to a CloudWatch stream of its own, `job-<name>`, the node's boot to `node-<rank>`.
FilterLogEvents returns the events of several streams a page at a time (`nextToken`), from
`startTime` in milliseconds (CloudWatch Logs API reference, FilterLogEvents).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
from collections.abc import Callable
from typing import Any, TextIO

from infra.deployed import ledger_spend, nodes, progress, stack_image, workspace
from infra.deployed.checkpoints import job_status, last_checkpoint, stop_report
from infra.deployed.leftovers import Leftover
from infra.deployed.stack_image import ImageRef
from infra.errors import ConfigError
from infra.jobs import spool
from infra.jobs.spool import JobSpec, JobState, current_run_uri
from infra.knowledge.resolver import Plan
from infra.project import WITHOUT_NODES_ENV
from infra.report import format_table
from infra.targets.target import FOLLOW_POLL_S, JobList, ListedJob, Say, Sleep, StackTarget
from training.contract import RUN_SPANS_FIELD

# Only these reach a node's user data or launch settings: a job, new code or a price travel
# through the job spool (infra/jobs/spool.py) and replace nothing.
REPLACE_NOTE = (
    "a replaced node is a new instance (its instance type, AMI, image or boot scripts "
    "changed), which loses its root volume's local checkpoints"
)

# The watcher's poll, then the job's checkpoint and exit (the unit's docker stop grace is
# 100 s: infra/node/templates/gpu-training.service).
CANCEL_WAIT_S = spool.POLL_S + 150


class SpoolTarget(StackTarget):
    def describe(self) -> str:
        return f"{len(self.stack.outputs.instance_ids)} node(s)"

    def up_summary(self) -> str:
        return ", ".join(self.stack.outputs.instance_ids)

    def run_uri(self, job: str) -> str:
        return f"{self.stack.checkpoint_uri.rstrip('/')}/{job}"

    def submit(self, spec: JobSpec, code: bytes | None) -> str:
        s3, name = self._aws("s3"), self.stack.name
        found = spool.find_job(s3, self.bucket, spec.name)
        if found is not None and found.state in (JobState.QUEUED, JobState.RUNNING):
            raise ConfigError(
                f"--name {spec.name}: that job is {found.state} on {name}; cancel it "
                f"first (`python -m infra cancel {name} {spec.name}`) or pick another"
            )
        spool.submit(s3, self.bucket, spec, code)
        resumed = (
            f"job {spec.name} was {found.state}: it resumes from its last checkpoint"
            if found is not None
            else f"job {spec.name} queued"
        )
        return (
            f"{resumed} on {name}; the node starts it within "
            f"{spool.POLL_S} s (a running job checkpoints and resumes after it).\n"
            f"follow it: python -m infra jobs {name}; "
            f"python -m infra logs {name} --job {spec.name}"
        )

    def jobs(self) -> JobList:
        contents = spool.read_spool(self._aws("s3"), self.bucket)
        notes = [f"job {job.spec.name} failed: {job.reason}" for job in contents.jobs if job.reason]
        notes += [f"skipped {what}" for what in contents.skipped]
        # One job holds the node at a time: the stack's spend over its starts is its cost.
        spend_over = (
            ledger_spend.spend_reader(self.stack) if self.stack.outputs.spend_ledger_table else None
        )
        return JobList(
            [ListedJob(job.spec.name, str(job.state), job.since) for job in contents.jobs],
            notes,
            spend_over,
        )

    def cancel(self, job: str, *, sleep: Sleep, now: Callable[[], float]) -> str:
        s3, name = self._aws("s3"), self.stack.name
        asked = datetime.datetime.now(datetime.UTC)
        found = spool.find_job(s3, self.bucket, job)
        if found is None:
            raise ConfigError(f"no job {job!r} on {name}: `python -m infra jobs {name}` lists them")
        if found.state not in (JobState.QUEUED, JobState.RUNNING, JobState.YIELDED):
            return f"job {job} is already {found.state}: nothing to cancel"
        spool.request_cancel(s3, self.bucket, job)
        deadline = now() + CANCEL_WAIT_S
        while True:
            found = spool.find_job(s3, self.bucket, job)
            if found is not None and found.state == JobState.CANCELLED:
                return f"job {job} cancelled: {stop_report(s3, self.run_uri(job), asked)}"
            if now() >= deadline:
                return (
                    f"job {job}: cancel requested, not yet done after {CANCEL_WAIT_S} s (the "
                    f"node may be stopped); `python -m infra jobs {name}` shows when"
                )
            sleep(spool.POLL_S / 2)

    def _running(self, ec2: Any) -> list[str]:
        return [
            n.instance_id
            for n in nodes.nodes(ec2, self.stack.outputs.instance_ids)
            if n.state == "running"
        ]

    def _stop_job(self, running: list[str], *, say: Say, sleep: Sleep) -> dict[str, str]:
        """SIGTERM to the job on each running node (it checkpoints); the SSM results."""
        asked = datetime.datetime.now(datetime.UTC)
        results = nodes.stop_job(self._aws("ssm"), running, say=say, sleep=sleep)
        s3 = self._aws("s3")
        say(stop_report(s3, current_run_uri(s3, self.stack.checkpoint_uri), asked))
        return results

    def stop(self, *, say: Say, sleep: Sleep) -> str:
        stack, ec2 = self.stack, self._aws("ec2")
        running = self._running(ec2)
        if not running:
            return f"no node of {stack.name} is running: nothing to stop"
        results = self._stop_job(running, say=say, sleep=sleep)
        failed = sorted(i for i, status in results.items() if status != "Success")
        if failed:
            say(
                f"the job did not confirm its stop on {', '.join(failed)} (SSM: "
                f"{', '.join(results[i] for i in failed)}): stopping anyway; the job resumes "
                "from its last committed checkpoint"
            )
        # A user stop of a persistent spot instance disables its request until start (EC2 docs).
        ec2.stop_instances(InstanceIds=running)
        ec2.get_waiter("instance_stopped").wait(
            InstanceIds=running, WaiterConfig={"Delay": 5, "MaxAttempts": 120}
        )
        s3 = self._aws("s3")
        checkpoint = last_checkpoint(s3, current_run_uri(s3, stack.checkpoint_uri))
        return (
            f"stopped {len(running)} node(s) of {stack.name}; last checkpoint "
            f"{checkpoint.describe() if checkpoint else 'none in S3'}. "
            f"`python -m infra start {stack.name}` resumes the job."
        )

    def start(self, *, say: Say, sleep: Sleep) -> str:
        stack, ec2 = self.stack, self._aws("ec2")
        stopped = [
            n.instance_id
            for n in nodes.nodes(ec2, stack.outputs.instance_ids)
            if n.state == "stopped"
        ]
        if not stopped:
            return (
                f"no node of {stack.name} is stopped: nothing to start "
                "(see `python -m infra status`)"
            )
        ec2.start_instances(InstanceIds=stopped)
        s3 = self._aws("s3")
        checkpoint = last_checkpoint(s3, current_run_uri(s3, stack.checkpoint_uri))
        return (
            f"starting {len(stopped)} node(s) of {stack.name}; the job resumes from "
            f"{checkpoint.describe() if checkpoint else 'step 0 (no checkpoint in S3 yet)'}. "
            f"Follow it with `python -m infra logs {stack.name} --follow`."
        )

    def logs(
        self, args: argparse.Namespace, *, out: TextIO, sleep: Sleep, now: Callable[[], float]
    ) -> None:
        stack = self.stack
        if args.job is not None and args.node is not None:
            raise ConfigError("--job and --node: give one (a job's stream, or a node's own lines)")
        count = len(stack.outputs.instance_ids)
        if args.node is not None and not 0 <= args.node < count:
            raise ConfigError(f"--node {args.node}: stack {stack.name} has nodes 0 to {count - 1}")
        group = stack.outputs.log_group
        streams = [f"node-{args.node}"] if args.node is not None else None
        if args.job is not None:
            streams = [spool.log_stream(spool.check_name(args.job, flag="--job"))]
        logs = self._aws("logs")
        start = int((now() - args.since * 60) * 1000)
        seen: set[str] = set()
        try:
            while True:
                # Sorted here: the order of events across streams within a reply is not promised.
                for event in sorted(_events(logs, group, streams, start), key=_when):
                    if event["eventId"] in seen:
                        continue  # the window overlaps the last poll's by one millisecond
                    seen.add(event["eventId"])
                    start = max(start, event["timestamp"])
                    out.write(_line(event))
                out.flush()
                if not args.follow:
                    break
                sleep(FOLLOW_POLL_S)
        except KeyboardInterrupt:
            pass
        except logs.exceptions.ResourceNotFoundException:
            raise ConfigError(
                f"log group {group} or its stream is not there yet: the node writes it once "
                "the container starts (`python -m infra status` shows the nodes)"
            ) from None

    def report(self, now: datetime.datetime) -> str:
        stack, out = self.stack, self.stack.outputs
        ec2, s3 = self._aws("ec2"), self._aws("s3")
        lines = [
            f"stack       {stack.name} ({stack.region}): {out.nodes} x "
            f"{out.instance_type}, {out.market}, ${out.hourly_cost_usd:,.2f}/h while running",
            "",
            format_table(
                ("NODE", "INSTANCE", "STATE", "SPOT REQUEST"),
                [
                    (n.rank, n.instance_id, n.state, n.spot_request or "-")
                    for n in nodes.nodes(ec2, stack.outputs.instance_ids)
                ],
            ),
            "",
        ]
        run_uri = current_run_uri(s3, stack.checkpoint_uri)  # the spool's current job
        status = job_status(s3, run_uri)
        lines.append(f"job         {progress.describe_job(status, now)}")
        rate = progress.unit_cost(out.hourly_cost_usd, status)
        if rate:
            lines.append(f"cost        {rate}")
        if status is not None and RUN_SPANS_FIELD in status and out.spend_ledger_table:
            lines.append(f"run spend   {progress.run_spend(stack, status[RUN_SPANS_FIELD])}")
        checkpoint = last_checkpoint(s3, run_uri)
        lines.append(f"checkpoint  {checkpoint.describe() if checkpoint else 'none yet'}")
        lines.append(f"spend       {progress.spend(stack, now)}")
        return "\n".join(lines)

    def before_destroy(self, *, say: Say, sleep: Sleep) -> None:
        if not self.stack.outputs.instance_ids:
            return
        ec2 = self._aws("ec2")
        running = self._running(ec2)
        if running:
            results = self._stop_job(running, say=say, sleep=sleep)
            say(", ".join(f"{i}: {status}" for i, status in sorted(results.items())))
        cancelled = nodes.cancel_spot_requests(ec2, self.stack.outputs.instance_ids)
        if cancelled:
            say(f"cancelled spot request(s) {', '.join(cancelled)} before the destroy")

    def log_groups(self) -> list[Leftover]:
        return []  # the node's log group is the program's: the destroy deletes it

    def kept_after_destroy(self) -> list[str]:
        return []


class SpoolDeployment:
    """`preview` and `up` of a single-node stack. Its first `up` creates the nodes only once
    their image is in the stack's repository: Pulumi's up without them (the repository, bucket,
    network and guardrails), then the image built and pushed here when docker is (else `up`
    stops and says how to push it), then Pulumi's up again with the nodes. An update of a
    stack that has nodes is Pulumi's up alone: they wait for a new image themselves."""

    def __init__(self, name: str, plan: Plan) -> None:
        self.name, self.plan = name, plan

    def check(self) -> None:
        pass

    def _builds_here(self, image: ImageRef) -> bool:
        """The image is the variant's own (its tag, no digest) and docker is here."""
        return stack_image.can_build() and image.digest is None and image.tag == self.plan.image_tag

    def preview(self, stack: Any, *, say: Say, policy_packs: list[str]) -> tuple[Any, str]:
        result = stack.preview(on_output=say, color="never", policy_packs=policy_packs)
        # change_summary maps Pulumi's OpType (a str enum) to counts.
        replaced = any(getattr(op, "value", op) == "replace" for op in result.change_summary)
        return result, REPLACE_NOTE if replaced else ""

    def prepare(
        self, open_stack: Callable[[], Any], *, say: Say, policy_packs: list[str]
    ) -> Any | None:
        # Said before the yes without opening the stack (Pulumi starts after it).
        how = (
            f"`up` builds {self.plan.variant.name} here with docker and pushes it first"
            if stack_image.can_build()
            else "with no docker here `up` stops after the repository for you to push it"
        )
        say(f"image       a new stack's nodes come once their image is in its repository: {how}")
        return None

    def up(self, stack: Any, pulumi_up: Callable[[], Any], *, say: Say, sleep: Sleep) -> Any:
        if _has_nodes(stack):
            return pulumi_up()
        with _without_nodes():
            first = pulumi_up()
        image = ImageRef.parse(first.outputs["image_uri"].value)
        ecr = workspace.aws("ecr", workspace.stack_region(stack, self.name))
        if not stack_image.is_pushed(ecr, image):
            if not self._builds_here(image):
                return first  # `up` says how to push it; the next `up` adds the nodes
            stack_image.build_and_push(ecr, image, self.plan.variant.name, say=say)
        say(f"{image} is in the stack's repository: creating the nodes")
        return pulumi_up()


def _has_nodes(stack: Any) -> bool:
    """Whether the stack has its instances (an update), from its last outputs."""
    found = stack.outputs().get("instance_ids")
    return bool(found and found.value)


@contextlib.contextmanager
def _without_nodes():
    """The program that Pulumi's up runs leaves the nodes out (infra/components/single_node.py)."""
    os.environ[WITHOUT_NODES_ENV] = "1"
    try:
        yield
    finally:
        del os.environ[WITHOUT_NODES_ENV]


def _events(logs, group: str, streams: list[str] | None, start: int):
    query = {"logGroupName": group, "startTime": start}
    if streams:
        query["logStreamNames"] = streams
    while True:
        page = logs.filter_log_events(**query)
        yield from page["events"]
        if not page.get("nextToken"):
            return
        query["nextToken"] = page["nextToken"]


def _when(event: dict) -> tuple[int, str]:
    return event["timestamp"], event["logStreamName"]


def _line(event: dict) -> str:
    when = datetime.datetime.fromtimestamp(event["timestamp"] / 1000, datetime.UTC)
    message = event["message"].rstrip("\n")
    return f"{event['logStreamName']}  {when:%H:%M:%S}  {message}\n"
