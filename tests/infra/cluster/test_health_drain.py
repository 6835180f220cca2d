"""A node that fails the health gate is drained with the reason, and the job, requeued,
finishes on the other node (the loopback cluster, tests/support/slurm.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.infra.cluster.jobs import STEPS, Submitted
from tests.support.slurm import NODES

pytestmark = pytest.mark.slow

INJECT = Path(__file__).with_name("inject")


def test_a_node_failing_the_gate_is_drained_and_the_job_completes_elsewhere(
    slurm, tmp_path, ci_log
):
    marker = tmp_path / "failed-node"
    job = Submitted(
        slurm, tmp_path / "job", nodes=1, PYTHONPATH=str(INJECT), GATE_FAIL_ONCE=str(marker)
    )
    try:
        state = job.wait_until_done()
        bad = marker.read_text()
        (good,) = set(NODES) - {bad}
        assert state["JobState"] == "COMPLETED" and state["ExitCode"] == "0:0", job.log[-3000:]
        assert state["Restarts"] == "1" and state["NodeList"] == good, state
        assert [r["step"] for r in job.metrics] == list(range(1, STEPS + 1))

        node = dict(
            re.findall(r"(\w+)=(\S*)", slurm.command("scontrol", "-o", "show", "node", bad))
        )
        assert node["State"] == "IDLE+DRAIN", node
        reason = slurm.command("sinfo", "--noheader", "--Node", f"--nodes={bad}", "--format=%E")
        assert reason.strip() == "health gate: efa: failed: 0 EFA devices (threshold: >= 1)"
        assert (
            f"slurm: drained {bad} (efa: failed: 0 EFA devices (threshold: >= 1)); "
            "requeueing the job onto other nodes" in job.log
        )
        assert "0: health: node fit for training" in job.log  # the gate passed on {good}
        ci_log(
            f"slurm test: job {job.id}: {bad} failed its health gate, drained "
            f"({reason.strip()}); requeued, {STEPS} steps on {good} to COMPLETED"
        )
    finally:
        if marker.exists():
            slurm.command("scontrol", "update", f"NodeName={marker.read_text()}", "State=RESUME")
