"""The Slurm cluster stack's target (gpu:cluster: slurm): a ParallelCluster head node.

Jobs are sbatch jobs submitted as the cluster's user on the head node through SSM
(infra/cluster/jobs.py); their code travels through the job spool's bucket, which the
container fetches. `cancel` is `scancel --full` (SIGTERM to every step: the job
checkpoints); `stop` holds the queue (running jobs checkpoint and go back to it, held) and
ParallelCluster ends the idle compute nodes after ScaledownIdletime, while the head node
keeps the queue; `start` starts the head node and the fleet if they were stopped and
releases the held jobs. A job's log is its output file, read on the head node piece by
piece (infra/cluster/control.py).
"""

from __future__ import annotations

import argparse
import datetime
from collections.abc import Callable
from typing import Any, TextIO

from infra.cluster import jobs as slurm
from infra.cluster.config import SCALEDOWN_IDLE_MINUTES, check_cluster_name
from infra.cluster.control import (
    STOP_WAIT_S,
    QueuedJob,
    log_script,
    parse_log_piece,
    parse_queue,
    release_script,
)
from infra.cluster.update import UpdateNeed
from infra.deployed import cluster_update, head_node, leftovers, progress
from infra.deployed.checkpoints import job_status, last_checkpoint, stop_report
from infra.deployed.cluster_fleet import start_fleet
from infra.errors import ConfigError
from infra.jobs import spool
from infra.jobs.spool import JobSpec
from infra.knowledge.resolver import Plan
from infra.report import format_table
from infra.targets.target import FOLLOW_POLL_S, JobList, ListedJob, Say, Sleep, StackTarget


class SlurmTarget(StackTarget):
    def describe(self) -> str:
        return "its Slurm cluster"

    def up_summary(self) -> str:
        out = self.stack.outputs
        return (
            f"Slurm cluster, head node {out.head_node}; "
            f"compute nodes start for each job. Submit: {out.submit_command}"
        )

    def run_uri(self, job: str) -> str:
        return f"{self.stack.checkpoint_uri.rstrip('/')}/{job}"

    def submit(self, spec: JobSpec, code: bytes | None) -> str:
        stack = self.stack
        in_queue = [job for job in head_node.queue(stack) if job.name == spec.name]
        if in_queue:
            raise ConfigError(
                f"--name {spec.name}: that job is in {stack.name}'s queue (job "
                f"{in_queue[0].id}, {in_queue[0].state.lower()}); cancel it first or pick "
                "another"
            )
        # The code travels through the spool on a cluster too: the container fetches it.
        spool.submit(self._aws("s3"), self.bucket, spec, code)
        code_uri = f"s3://{self.bucket}/{spool.job_key(spec.name, spool.CODE_NAME)}"
        job_id = head_node.on_head_node(
            stack,
            slurm.submit_script(
                slurm.cluster_site(self.bucket), spec, code_uri if spec.has_code else None
            ),
            what=f"submit job {spec.name}",
            timeout_s=slurm.SUBMIT_TIMEOUT_S,
        ).strip()
        return (
            f"job {spec.name} submitted to {stack.name}'s Slurm queue as job {job_id} "
            f"(a name run before resumes from its checkpoints).\n"
            f"follow it: python -m infra jobs {stack.name}; "
            f"python -m infra logs {stack.name} --job {job_id}"
        )

    def jobs(self) -> JobList:
        # The ledger counts every job's nodes together: a job's cost is the trainer's figure.
        return JobList(
            [
                ListedJob(job.name, f"{job.state.lower()} (slurm {job.id}, {job.elapsed})", None)
                for job in head_node.queue(self.stack)
            ],
            [],
        )

    def cancel(self, job: str, *, sleep: Sleep, now: Callable[[], float]) -> str:
        asked = datetime.datetime.now(datetime.UTC)
        ids = head_node.on_head_node(
            self.stack,
            slurm.cancel_script(job),
            what=f"cancel job {job}",
            timeout_s=STOP_WAIT_S + 60,
            sleep=sleep,
        ).split()
        report = stop_report(self._aws("s3"), self.run_uri(job), asked)
        return f"job {job} (slurm {', '.join(ids)}) cancelled: {report}"

    def stop(self, *, say: Say, sleep: Sleep) -> str:
        stack = self.stack
        state = head_node.head_node_state(stack)
        if state != "running":
            return f"the head node of {stack.name} is {state}: no job runs, nothing to stop"
        held = head_node.hold_queue(stack, say=say, sleep=sleep)
        idle = stack.outputs.idle_usd_per_hour or 0
        return (
            f"held {len(held)} job(s) of {stack.name}; the compute nodes end after "
            f"{SCALEDOWN_IDLE_MINUTES} idle minutes, and the head node keeps the queue "
            f"(${idle:,.3f}/h). `python -m infra start {stack.name}` releases the jobs, "
            f"`python -m infra down {stack.name}` removes the cluster."
        )

    def start(self, *, say: Say, sleep: Sleep) -> str:
        stack, ec2 = self.stack, self._aws("ec2")
        state = head_node.head_node_state(stack)
        if state == "gone":
            raise ConfigError(
                f"the head node {stack.outputs.head_node} of {stack.name} is gone: "
                f"`python -m infra up {stack.name}` shows what the stack needs"
            )
        if state != "running":
            say(f"starting the head node {stack.outputs.head_node} (it was {state})")
            ec2.start_instances(InstanceIds=[stack.outputs.head_node])
            ec2.get_waiter("instance_running").wait(
                InstanceIds=[stack.outputs.head_node], WaiterConfig={"Delay": 5, "MaxAttempts": 120}
            )
        start_fleet(stack, say=say, sleep=sleep)
        released = parse_queue(
            head_node.on_head_node(
                stack,
                release_script(),
                what="release the held jobs",
                timeout_s=60,
                sleep=sleep,
                registration_wait_s=head_node.REGISTRATION_WAIT_S,
            )
        )
        # Jobs Slurm put back in the queue unheld (a node lost, a budget stop that could not
        # hold them first) start again too: they are listed with the released ones.
        released_ids = {job.id for job in released}
        queued = [job for job in head_node.queue(stack, sleep=sleep) if job.id not in released_ids]
        if not released and not queued:
            return f"the queue of {stack.name} is empty: nothing to resume"
        s3 = self._aws("s3")
        lines = [f"the queue of {stack.name}: Slurm starts nodes for its pending jobs (minutes)"]
        for job, what in [
            *((job, "released") for job in released),
            *((job, job.state.lower()) for job in queued),
        ]:
            checkpoint = last_checkpoint(s3, head_node.run_uri(stack, job))
            since = checkpoint.describe() if checkpoint else "step 0 (no checkpoint in S3 yet)"
            lines.append(f"  job {job.id} ({job.name}) {what}: resumes from {since}")
        lines.append(f"Follow it with `python -m infra logs {stack.name} --follow`.")
        return "\n".join(lines)

    def logs(
        self, args: argparse.Namespace, *, out: TextIO, sleep: Sleep, now: Callable[[], float]
    ) -> None:
        """A job's output file, its last piece first, then (--follow) what it adds."""
        stack = self.stack
        if args.node is not None:
            raise ConfigError(
                f"--node: a job's log on the cluster {stack.name} holds every node's lines; "
                "choose the job with --job ID"
            )
        job_id = args.job
        if job_id is None:
            jobs = head_node.queue(stack, sleep=sleep)
            if not jobs:
                raise ConfigError(
                    f"the queue of {stack.name} is empty: name a finished job with --job ID"
                )
            job_id = max(jobs, key=lambda job: int(job.id)).id
        elif not job_id.isdigit():
            raise ConfigError(f"--job {job_id}: a Slurm job id is a number, e.g. --job 12")
        offset = -1  # the file's last piece
        try:
            while True:
                start, piece = parse_log_piece(
                    head_node.on_head_node(
                        stack,
                        log_script(job_id, offset),
                        what=f"read job {job_id}'s log",
                        timeout_s=60,
                        sleep=sleep,
                    )
                )
                out.write(piece)
                out.flush()
                offset = start + len(piece.encode())
                if piece:
                    continue  # more may be there already: read on before waiting
                if not args.follow:
                    break
                sleep(FOLLOW_POLL_S)
        except KeyboardInterrupt:
            pass

    def report(self, now: datetime.datetime) -> str:
        """Its instances, its queue and each queued job's progress."""
        stack, out = self.stack, self.stack.outputs
        found = head_node.cluster_nodes(self._aws("ec2"), stack.cost_tag, out.market)
        lines = [
            f"stack       {stack.name} ({stack.region}): Slurm cluster, queue {out.queue} of "
            f"up to {out.nodes} x {out.instance_type}, {out.market}, "
            f"${out.hourly_cost_usd:,.2f}/h with every node running; "
            f"${out.idle_usd_per_hour or 0:,.2f}/h idle (the head node and the NAT gateway)",
            "",
            format_table(
                ("ROLE", "INSTANCE", "TYPE", "STATE", "MARKET"),
                [(n.role, n.instance_id, n.instance_type, n.state, n.market) for n in found],
            ),
            "",
        ]
        state = head_node.head_node_state(stack, found)
        if state != "running":
            lines.append(
                f"queue       unknown: the head node is {state}; "
                f"`python -m infra start {stack.name}` starts it"
            )
        else:
            try:
                jobs = head_node.queue(stack)
            except ConfigError as unanswered:  # the rest of the status still stands
                jobs = []
                lines.append(f"queue       unknown: {unanswered}")
            else:
                lines.append(f"queue       {_queue_summary(jobs)}")
            if jobs:
                lines += [
                    "",
                    format_table(
                        ("JOB", "NAME", "STATE", "NODES", "TIME", "REASON"),
                        [(j.id, j.name, _job_state(j), j.nodes, j.elapsed, j.reason) for j in jobs],
                    ),
                    "",
                ]
            s3 = self._aws("s3")
            for job in jobs:
                uri = head_node.run_uri(stack, job)
                checkpoint = last_checkpoint(s3, uri)
                lines.append(f"job {job.name:<8}{progress.describe_job(job_status(s3, uri), now)}")
                lines.append(f"  checkpoint  {checkpoint.describe() if checkpoint else 'none yet'}")
        lines.append(f"spend       {progress.spend(stack, now)}")
        return "\n".join(lines)

    def before_destroy(self, *, say: Say, sleep: Sleep) -> None:
        if head_node.head_node_state(self.stack) == "running":
            head_node.hold_queue(self.stack, say=say, sleep=sleep)

    def log_groups(self) -> list[leftovers.Leftover]:
        # ParallelCluster keeps the cluster's log groups after its stack is deleted
        # (infra/deployed/leftovers.py, cluster_log_groups).
        out = self.stack.outputs
        return leftovers.cluster_log_groups(
            self._aws("logs"),
            out.cluster_log_group_prefix,
            self._aws("cloudformation"),
            out.cluster_name,
        )

    def kept_after_destroy(self) -> list[str]:
        return [
            f"  s3://{shared} (ParallelCluster's, for every cluster of {self.stack.region})"
            for shared in leftovers.parallelcluster_buckets(self._aws("s3"))
        ]


class SlurmDeployment:
    """`preview` and `up` of a cluster stack: what ParallelCluster's update needs, said
    before the question, and done around Pulumi's up (infra/deployed/cluster_update.py)."""

    def __init__(self, name: str, plan: Plan) -> None:
        # The plan is not needed: the cluster's nodes start with a job, which waits for its
        # image (Pyxis pulls it then), so none bills before the image is pushed.
        self.name = name
        self.change: cluster_update.PlannedChange | None = None

    def check(self) -> None:
        check_cluster_name(cluster_update.cluster_name(self.name), self.name)

    def preview(self, stack: Any, *, say: Say, policy_packs: list[str]) -> tuple[Any, str]:
        result, change = cluster_update.plan(stack, self.name, say=say, policy_packs=policy_packs)
        return result, change.verdict.line()

    def prepare(
        self, open_stack: Callable[[], Any], *, say: Say, policy_packs: list[str]
    ) -> Any | None:
        stack = open_stack()
        _, self.change = cluster_update.plan(stack, self.name, say=say, policy_packs=policy_packs)
        if self.change.verdict.need is UpdateNeed.REPLACEMENT:
            raise ConfigError(self.change.verdict.line())
        return stack

    def up(self, stack: Any, pulumi_up: Callable[[], Any], *, say: Say, sleep: Sleep) -> Any:
        assert self.change is not None, "prepare() comes first"
        return cluster_update.apply(self.change, stack, pulumi_up, say=say, sleep=sleep)


def _queue_summary(jobs: list[QueuedJob]) -> str:
    if not jobs:
        return "empty: no job, so no compute node runs (`pulumi stack output submit_command`)"
    held = sum(job.held for job in jobs)
    text = f"{len(jobs)} job(s)"
    if held:
        text += f", {held} held (`python -m infra start` releases them)"
    return text


def _job_state(job: QueuedJob) -> str:
    if job.held:
        return "held"
    if job.state == "PENDING":
        return "waiting for nodes"
    return job.state.lower()
