"""A node is drained through the Epilog (infra/cluster/epilog.py), which runs as root, for a
job submitted by a user who may not drain nodes; the job, requeued, runs on the other node
(the loopback cluster, tests/support/slurm.py: SlurmUser=slurm, jobs as JOB_USER).

- A node that fails the job's health gate: the job leaves its verdict there and requeues
  itself; the Epilog drains the node with the failed checks as the reason.
- A node whose instance has a spot interruption notice: the trainer checkpoints and the job
  requeues itself; the Epilog, asking the node's metadata service, drains the node, so the
  job does not start again on an instance EC2 is about to end.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest

from tests.infra.cluster.jobs import JOB, Submitted
from tests.support.slurm import JOB_USER, NODES

SLOW = pytest.mark.slow(reason="two starts of a training job, 11 s of requeue between", seconds=180)

INJECT = Path(__file__).with_name("inject")
# Training is not what these stories prove: few steps, so each start is mostly start-up.
STEPS = 24
SHORT = (*JOB, f"train.steps={STEPS}")
NOTICE_TIME = "2026-12-01T10:02:00Z"


def assert_submitted_by_a_user_who_may_not_drain(slurm, state: dict[str, str]) -> None:
    assert state["UserId"].startswith(f"{JOB_USER}("), state["UserId"]
    refused = slurm.run(
        "scontrol", "update", f"NodeName={NODES[0]}", "State=DRAIN", "Reason=x", as_job_user=True
    )
    assert refused.returncode != 0, "the job's user may drain nodes: the test proves nothing"


@SLOW
def test_a_node_failing_the_gate_is_drained_by_the_epilog_and_the_job_completes_elsewhere(
    slurm, ci_log
):
    marker = slurm.workspace() / "failed-node"
    job = Submitted(slurm, nodes=1, job=SHORT, PYTHONPATH=str(INJECT), GATE_FAIL_ONCE=str(marker))
    state = job.wait_until_done()
    bad = marker.read_text()
    (good,) = set(NODES) - {bad}
    assert state["JobState"] == "COMPLETED" and state["ExitCode"] == "0:0", job.log[-3000:]
    assert state["Restarts"] == "1" and state["NodeList"] == good, state
    assert [r["step"] for r in job.metrics] == list(range(1, STEPS + 1))
    assert_submitted_by_a_user_who_may_not_drain(slurm, state)

    failed = "efa: failed: 0 EFA devices (threshold: >= 1)"
    node = slurm.node(bad)
    assert node["State"] == "IDLE+DRAIN", node
    assert node["Reason"] == f"health gate: {failed}"
    assert (
        f"slurm: {bad} failed its health gate ({failed}): it is drained as the job leaves it; "
        "requeueing the job onto other nodes" in job.log
    )
    assert "0: health: node fit for training" in job.log  # the gate passed on {good}
    assert list(slurm.node_verdicts.iterdir()) == []  # the Epilog took the verdict
    ci_log(
        f"slurm test: job {job.id}, submitted by {JOB_USER} (not a Slurm admin): {bad} failed "
        f"its health gate, drained by the Epilog ({node['Reason']}); requeued, "
        f"{STEPS} steps on {good} to COMPLETED"
    )


@SLOW
def test_a_job_requeued_after_a_spot_notice_starts_again_on_another_node(slurm, ci_log):
    job = Submitted(
        slurm, nodes=1, job=SHORT, PYTHONPATH=str(INJECT), LOOPBACK_METADATA=slurm.metadata.base
    )
    noticed = job.wait_until_running()
    slurm.metadata.give_notice(noticed, NOTICE_TIME)
    state = job.wait_until_done()
    (other,) = set(NODES) - {noticed}
    assert state["JobState"] == "COMPLETED" and state["ExitCode"] == "0:0", job.log[-3000:]
    assert state["Restarts"] == "1" and state["NodeList"] == other, state
    assert_submitted_by_a_user_who_may_not_drain(slurm, state)

    stop = re.search(
        rf"stopped at step (\d+) \(spot interruption: terminate at {NOTICE_TIME}\); "
        "checkpoint saved",
        job.log,
    )
    assert stop, job.log[-3000:]
    step = int(stop.group(1))
    assert f"resumed from {job.work}/ckpt/train/step_{step:08d} at step {step}" in job.log
    assert [r["step"] for r in job.metrics] == list(range(1, STEPS + 1))
    node = slurm.node(noticed)
    assert node["State"] == "IDLE+DRAIN", node
    assert node["Reason"] == f"spot interruption notice: terminate at {NOTICE_TIME}"
    ci_log(
        f"slurm test: job {job.id}, submitted by {JOB_USER}: spot notice on {noticed}, "
        f"checkpoint at step {step}, requeued; the Epilog drained {noticed} "
        f"({node['Reason']}), the job resumed on {other} and completed"
    )


def test_the_epilog_drains_for_a_verdict_the_jobs_user_left_and_for_no_one_elses(slurm):
    """A verdict counts only as a plain file the job's own user made (a symlink, or a file of
    another user, would let anyone drain the nodes of someone else's job)."""
    env = {**slurm.env, **slurm.job_variables()}
    submitted = slurm.command(
        "sbatch", "--parsable", "--hold", "--nodes=2", "--wrap=true", env=env, as_job_user=True
    )
    job_id = submitted.strip().split(";")[0]
    forged = slurm.node_verdicts / f"{job_id}.n1"
    forged.write_text("health gate: forged by root\n")  # root's, not the job user's
    own = slurm.node_verdicts / f"{job_id}.n2"
    own.write_text("health gate: left by the job\n")
    os.chown(own, slurm.user.pw_uid, slurm.user.pw_gid)
    slurm.command("scontrol", "release", job_id)
    deadline = time.monotonic() + 60
    while slurm.job(job_id)["JobState"] != "COMPLETED" or "drain" not in slurm.node_states()["n2"]:
        assert time.monotonic() < deadline, (slurm.job(job_id), slurm.node_states())
        time.sleep(0.2)
    assert slurm.node("n2")["Reason"] == "health gate: left by the job"
    assert slurm.node_states()["n1"] == "idle"
    assert list(slurm.node_verdicts.iterdir()) == []
