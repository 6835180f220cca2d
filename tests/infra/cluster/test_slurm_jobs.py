"""The project's sbatch script on a real two-node Slurm cluster (loopback, tests/support/slurm.py).

Each job (tests/infra/cluster/jobs.py) is the stack's sbatch script run with the host's
interpreter on both nodes. A job that is stopped (SIGTERM through
scancel) or loses a node (set DOWN) must be requeued by Slurm and resume, and
the finished run's losses must equal those of the module's uninterrupted run.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from infra.cluster.sbatch import Launch
from infra.components.cluster import CONTAINER_MOUNTS
from tests.infra.cluster.jobs import JOB_NAME, STEPS, Submitted, assert_completed

PYXIS_ENV = Path(__file__).with_name("pyxis_env.py")
IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/gpu-stack-test-images:1.0-cu128"
# What the stack's image sets (images/Dockerfile, ENV): where its checkpoints go by default.
IMAGE_CHECKPOINT_DIR = "TRAIN_CHECKPOINT_DIR=/checkpoints"

pytestmark = pytest.mark.slow


@pytest.fixture
def say(capsys, pytestconfig):
    """Write a line to the terminal past pytest's capture: the CI log shows each job's story."""
    reporter = pytestconfig.pluginmanager.get_plugin("terminalreporter")

    def write(line: str) -> None:
        with capsys.disabled():
            reporter.write_line(f"slurm test: {line}")

    return write


@pytest.fixture(scope="module")
def uninterrupted(slurm, tmp_path_factory) -> tuple[Submitted, dict]:
    """The job run to its end with nothing in the way: the reference for the others."""
    job = Submitted(slurm, tmp_path_factory.mktemp("uninterrupted"))
    return job, job.wait_until_done()


@pytest.fixture(scope="module")
def reference_losses(uninterrupted) -> list[float]:
    return assert_completed(*uninterrupted)


def assert_finished_like_the_reference(job: Submitted, state: dict, reference: list[float]):
    assert assert_completed(job, state) == pytest.approx(reference, rel=1e-6, abs=1e-7)


def test_a_job_trains_across_both_nodes_to_completion(uninterrupted, say):
    job, state = uninterrupted
    losses = assert_completed(job, state)
    assert state["Restarts"] == "0"
    assert state["NodeList"] == "n[1-2]"
    # One launcher per node, node ranks from SLURM_NODEID, node 0 the rendezvous host.
    assert re.search(r"job \d+ start 0 on n1 n2, rendezvous 127\.0\.0\.1:\d+", job.log)
    for node in (0, 1):
        assert f"starting 1 worker(s) on node {node} of 2 (world size 2)" in job.log
    assert losses[-1] < losses[0]  # it learnt something
    say(f"job {job.id} trained {STEPS} steps on n1+n2 to {state['JobState']}, exit 0")


def test_sigterm_checkpoints_exits_75_is_requeued_and_resumes(
    slurm, tmp_path, reference_losses, say
):
    job = Submitted(slurm, tmp_path)
    job.wait_for_step(3)
    slurm.command("scancel", "--signal=TERM", job.id)
    state = job.wait_until_done()

    stops = re.findall(r"stopped at step (\d+) \(SIGTERM\); checkpoint saved", job.log)
    assert len(stops) == 2 and stops[0] == stops[1], job.log[-3000:]  # both nodes' ranks
    step = int(stops[0])
    assert 3 <= step < STEPS
    assert state["Restarts"] == "1", job.log[-3000:]  # requeued through RequeueExit=75
    checkpoint = tmp_path / "ckpt" / JOB_NAME / f"step_{step:08d}"
    assert f"resumed from {checkpoint} at step {step}" in job.log
    assert_finished_like_the_reference(job, state, reference_losses)
    say(
        f"job {job.id}: SIGTERM, checkpoint at step {step}, exit 75, requeued, resumed at "
        f"step {step}, completed; losses equal the uninterrupted run's"
    )


def test_a_node_set_down_requeues_the_job_and_it_resumes(slurm, tmp_path, reference_losses, say):
    job = Submitted(slurm, tmp_path)
    job.wait_for_step(5)  # past the checkpoint of step 4
    slurm.command("scontrol", "update", "NodeName=n2", "State=DOWN", "Reason=reclaimed")
    try:
        deadline = time.monotonic() + 60
        while (state := job.state())["Restarts"] == "0":  # NODE_FAIL: back in the queue
            assert time.monotonic() < deadline, f"not requeued: {state}\n{job.log[-3000:]}"
            time.sleep(0.2)
    finally:
        # The node comes back: ReturnToService=2 may already have done it when its slurmd
        # answered, and then RESUME is refused as an invalid state change.
        slurm.command("scontrol", "update", "NodeName=n2", "State=RESUME", check=False)
    state = job.wait_until_done()

    resumed = re.findall(r"resumed from \S+/step_(\d+) at step (\d+)", job.log)
    assert resumed and int(resumed[-1][1]) >= 4, job.log[-3000:]
    assert "Node failure on n2" in job.log
    assert state["Restarts"] == "1"
    assert_finished_like_the_reference(job, state, reference_losses)
    say(
        f"job {job.id}: n2 set DOWN, NODE_FAIL, requeued, resumed at step {resumed[-1][1]}, "
        "completed; losses equal the uninterrupted run's"
    )


def as_under_pyxis(image_env: str) -> Launch:
    """Each node's task started as Pyxis starts it in the stack's image: the image's
    environment over the job's, but for the names the stack's launch gives --container-env.
    srun runs its first word that is not an option: the emulator, which runs the rest."""
    (container_env,) = [
        option
        for option in Launch.container(IMAGE, CONTAINER_MOUNTS).srun_options
        if option.startswith("--container-env=")
    ]
    emulator = (sys.executable, str(PYXIS_ENV), "--image-env", image_env, container_env, "--")
    return Launch(srun_options=emulator, python=sys.executable)


def test_the_emulator_applies_the_images_environment_unless_the_job_keeps_it(tmp_path):
    def seen(container_env: str, job_value: str) -> str:
        return subprocess.run(
            [
                *(sys.executable, str(PYXIS_ENV), "--image-env", IMAGE_CHECKPOINT_DIR),
                *(container_env, "--", "sh", "-c", "echo $TRAIN_CHECKPOINT_DIR"),
            ],
            env={"PATH": "/usr/bin:/bin", "TRAIN_CHECKPOINT_DIR": job_value},
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()

    assert seen("--container-env=", "/scratch/checkpoints/a") == "/checkpoints"
    assert seen("--container-env=TRAIN_CHECKPOINT_DIR", "/scratch/checkpoints/a") == (
        "/scratch/checkpoints/a"
    )


def test_the_jobs_checkpoints_land_where_the_sbatch_said_when_the_image_sets_its_own(
    slurm, tmp_path, say
):
    job = Submitted(slurm, tmp_path, launch=as_under_pyxis(IMAGE_CHECKPOINT_DIR))
    state = job.wait_until_done()
    assert state["JobState"] == "COMPLETED", job.log[-3000:]
    committed = sorted(p.name for p in (tmp_path / "ckpt" / JOB_NAME).glob("step_*"))
    assert f"step_{STEPS:08d}" in committed, committed
    assert "/checkpoints" not in job.log
    say(
        f"job {job.id}: the image sets {IMAGE_CHECKPOINT_DIR}; checkpoints committed under "
        f"the sbatch's {tmp_path / 'ckpt' / JOB_NAME} ({len(committed)} of them)"
    )
