"""The project's sbatch script on a real two-node Slurm cluster (loopback, tests/support/slurm.py).

Each job (tests/infra/cluster/jobs.py) is the stack's sbatch script run with the host's
interpreter on both nodes. A job that is stopped (SIGTERM through
scancel) or loses a node (set DOWN) must be requeued by Slurm and resume, and
the finished run's losses must equal those of the module's uninterrupted run.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from infra.cluster.sbatch import Launch
from infra.components.cluster import CONTAINER_MOUNTS
from tests.infra.cluster.jobs import (
    JOB,
    JOB_NAME,
    STEPS,
    Submitted,
    assert_completed,
    assert_completed_after_a_crash,
)
from training.contract import CRASH_RESTARTS

PYXIS_ENV = Path(__file__).with_name("pyxis_env.py")
IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/gpu-stack-test-images:1.0-cu128"
# What the stack's image sets (images/Dockerfile, ENV): where its checkpoints go by default.
IMAGE_CHECKPOINT_DIR = "TRAIN_CHECKPOINT_DIR=/checkpoints"

pytestmark = pytest.mark.multiprocess
# Gloo over loopback moves about 1 GB/s (measured): a figure it passes, and one it cannot.
FABRIC_FIGURE, FABRIC_FIGURE_OUT_OF_REACH = "0.01", "100000"


@pytest.fixture
def say(ci_log):
    """A line in the CI log (tests/support/ci_log.py): each job's story."""

    def write(line: str) -> None:
        ci_log(f"slurm test: {line}")

    return write


@pytest.fixture(scope="module")
def uninterrupted(slurm_session) -> tuple[Submitted, dict]:
    """The job run to its end with nothing in the way: the reference for the others."""
    slurm_session.back_in_service()  # as the `slurm` fixture leaves it for a test
    # A catalog figure for the network between the nodes: the fabric check runs first.
    job = Submitted(slurm_session, TRAIN_EXPECT_FABRIC_BUSBW_GBPS=FABRIC_FIGURE)
    return job, job.wait_until_done()


@pytest.fixture(scope="module")
def reference_losses(uninterrupted) -> list[float]:
    return assert_completed(*uninterrupted)


def assert_finished_like_the_reference(job: Submitted, state: dict, reference: list[float]):
    assert assert_completed(job, state) == pytest.approx(reference, rel=1e-6, abs=1e-7)


@pytest.mark.slow(
    reason="a job story on the loopback Slurm cluster: real sbatch, srun and 2-rank training, "
    "and the module's uninterrupted reference job when this test comes first (up to 115 s)",
    seconds=240,
)
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
    # Before training, the fabric check across both nodes, on the rendezvous port the
    # launchers then took.
    assert re.search(
        r"fabric: all-reduce: ok: [\d.]+ GB/s bus bandwidth across 2 ranks on 2 nodes, "
        r"16 MiB each \(threshold: >= 0\.0 GB/s, 80% of 0\.01\)",
        job.log,
    ), job.log[:3000]
    fit = job.log.index("fabric: the nodes' network is fit for training")
    assert fit < job.log.index("starting 1 worker(s) on node 0")
    say(f"job {job.id} trained {STEPS} steps on n1+n2 to {state['JobState']}, exit 0")


# 103 to 119 s in full fresh-clone runs on 2 cores (measured).
@pytest.mark.slow(
    reason="a job story on the loopback Slurm cluster: NODE_FAIL, a requeue and a second start",
    seconds=250,
)
def test_a_node_set_down_requeues_the_job_and_it_resumes(slurm, reference_losses, say):
    job = Submitted(slurm)
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
    # A lost node is a crash: the steps rank 0 logged past the checkpoint it resumed from
    # (none when the stop signal reached both ranks in time to save) are trained again.
    losses = assert_completed_after_a_crash(job, state)
    assert losses == pytest.approx(reference_losses, rel=1e-6, abs=1e-7)
    say(
        f"job {job.id}: n2 set DOWN, NODE_FAIL, requeued, resumed at step {resumed[-1][1]}, "
        "completed; losses equal the uninterrupted run's"
    )


def test_a_network_below_the_catalogs_figure_fails_the_job_before_it_trains(slurm, say):
    job = Submitted(slurm, TRAIN_EXPECT_FABRIC_BUSBW_GBPS=FABRIC_FIGURE_OUT_OF_REACH)
    state = job.wait_until_done()
    assert (state["JobState"], state["ExitCode"]) == ("FAILED", "1:0"), job.log[-3000:]
    assert state["Restarts"] == "0"  # not requeued: another start meets the same network
    assert "(threshold: >= 80000.0 GB/s, 80% of 100000)" in job.log
    assert re.search(r"^failed: fabric: all-reduce: failed: [\d.]+ GB/s", job.log, re.M)
    assert "slurm: the network between the nodes failed its check (above)" in job.log
    assert "starting 1 worker(s)" not in job.log and job.metrics == []
    # No one node is to blame: none is drained.
    assert [slurm.node(name)["State"] for name in ("n1", "n2")] == ["IDLE", "IDLE"]
    say(f"job {job.id}: the fabric check found the network below the catalog's figure; FAILED")


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


# Where checkpoints land is what this story proves, not training: a few steps, so the
# job is mostly its start (62 s of 240 steps in a loaded CI run).
SHORT_STEPS = 12


def test_the_jobs_checkpoints_land_where_the_sbatch_said_when_the_image_sets_its_own(slurm, say):
    job = Submitted(
        slurm,
        launch=as_under_pyxis(IMAGE_CHECKPOINT_DIR),
        job=(*JOB, f"train.steps={SHORT_STEPS}"),
    )
    state = job.wait_until_done()
    assert state["JobState"] == "COMPLETED", job.log[-3000:]
    committed = sorted(p.name for p in (job.work / "ckpt" / JOB_NAME).glob("step_*"))
    assert f"step_{SHORT_STEPS:08d}" in committed, committed
    assert "/checkpoints" not in job.log
    say(
        f"job {job.id}: the image sets {IMAGE_CHECKPOINT_DIR}; checkpoints committed under "
        f"the sbatch's {job.work / 'ckpt' / JOB_NAME} ({len(committed)} of them)"
    )


def wait_for_restarts(job: Submitted, count: int) -> None:
    deadline = time.monotonic() + 120
    while int(job.state()["Restarts"]) < count:
        assert time.monotonic() < deadline, f"not requeued:\n{job.log[-3000:]}"
        time.sleep(0.2)


@contextlib.contextmanager
def requeue_exit_75(slurm):
    """The cluster with RequeueExit=75 in its slurm.conf, as ParallelCluster's has
    (CustomSlurmSettings, infra/cluster/config.py): slurmctld rereads its configuration on
    `scontrol reconfigure` (scontrol(1)), running jobs and all."""
    original = slurm.conf.read_text()
    slurm.conf.write_text(f"{original}RequeueExit=75\n")
    try:
        slurm.command("scontrol", "reconfigure")
        config = slurm.command("scontrol", "show", "config")
        assert re.search(r"^RequeueExit\s*=\s*75$", config, re.MULTILINE), "not in effect"
        yield
    finally:
        slurm.conf.write_text(original)
        slurm.command("scontrol", "reconfigure")


STOPPED = r"stopped at step (\d+) \(SIGTERM\); checkpoint saved"
# Every way a running job is told to stop, and what each signals (scancel(1), scontrol(1)).
STOPS = {
    # The job's tasks only: scancel's default for --signal.
    "scancel --signal=TERM": ("scancel", "--signal=TERM"),
    # The batch shell alone: what the time-limit warning (#SBATCH --signal=B:TERM@...) does.
    "scancel --signal=TERM --batch": ("scancel", "--signal=TERM", "--batch"),
    # The batch shell, srun and the tasks.
    "scancel --signal=TERM --full": ("scancel", "--signal=TERM", "--full"),
    # Slurm's own requeue (the project's stop uses requeuehold): every process of the job.
    "scontrol requeue": ("scontrol", "requeue"),
}


def stop_and_wait_for_the_requeue(slurm, job: Submitted, how: str, stop: int, after: int) -> int:
    """Once the job trained past step `after`, stop it the way `how` names and wait until it
    is back in the queue; the step both ranks checkpointed at for stop number `stop`."""
    job.wait_for_step(after + 3)
    slurm.command(*STOPS[how], job.id)
    wait_for_restarts(job, stop)
    # Slurm counts a requeue it makes itself (scontrol requeue) before the ranks have
    # written their lines: both nodes' ranks, each time.
    deadline = time.monotonic() + 60
    while len(stops := re.findall(STOPPED, job.log)) < 2 * stop:
        assert time.monotonic() < deadline, (how, job.log[-3000:])
        time.sleep(0.2)
    assert len(stops) == 2 * stop, (how, job.log[-3000:])
    assert stops[-1] == stops[-2] and int(stops[-1]) >= after + 3, (how, stops)
    return int(stops[-1])


@pytest.mark.slow(
    reason="one job stopped four ways on the loopback Slurm cluster: five starts of 2 ranks",
    seconds=480,
)
def test_every_kind_of_stop_checkpoints_is_one_requeue_and_resumes(slurm, reference_losses, say):
    """Each stop: both ranks checkpoint at one step, exit 75, the job is requeued once and
    resumes there; the finished run's losses equal the uninterrupted run's. The first two
    stops are requeued by the script itself (this cluster's slurm.conf has no RequeueExit);
    the last two with RequeueExit=75 set, which must not make a stop two requeues."""
    job = Submitted(slurm)
    hows, step = list(STOPS), 0
    for stop, how in enumerate(hows[:2], start=1):
        step = stop_and_wait_for_the_requeue(slurm, job, how, stop, step)
    with requeue_exit_75(slurm):
        for stop, how in enumerate(hows[2:], start=3):
            step = stop_and_wait_for_the_requeue(slurm, job, how, stop, step)
        state = job.wait_until_done()

    assert "forcing job termination" not in job.log
    assert state["Restarts"] == str(len(STOPS)), job.log[-3000:]
    resumed = [int(s) for s in re.findall(r"resumed from \S+ at step (\d+)", job.log)]
    stopped = [int(s) for s in re.findall(r"stopped at step (\d+) \(SIGTERM\)", job.log)[::2]]
    assert resumed == stopped, job.log[-3000:]
    assert f"resumed from {job.work}/ckpt/{JOB_NAME}/step_{stopped[0]:08d}" in job.log
    assert_finished_like_the_reference(job, state, reference_losses)
    say(
        f"job {job.id}: stopped by {', '.join(hows)}; each a checkpoint (steps {stopped}), "
        "exit 75, one requeue and a resume there; completed with the uninterrupted run's losses"
    )


@pytest.mark.slow(
    reason="a job story on the loopback Slurm cluster: real sbatch, srun and 2-rank training, "
    "and the module's uninterrupted reference job when this test comes first (up to 115 s)",
    seconds=240,
)
def test_a_killed_worker_restarts_the_launchers_from_the_last_checkpoint(
    slurm, reference_losses, say
):
    job = Submitted(slurm)
    job.wait_for_step(6)  # past the checkpoint of step 4
    job.kill(1, worker=True)
    state = job.wait_until_done()

    assert "rank 1 (local rank 0) on node 1 (n2) was killed by SIGKILL" in job.log
    # 3 restarts in 6 hours (training/contract.py), the single-node boot unit's bound
    assert "(crash 1 in 21600 s, restart 1 of 3): starting again from the" in job.log
    # The tasks srun saw end badly, each named with its node: the killed one among them
    # (the other node's launcher may end first, when its rendezvous breaks).
    (line,) = [line for line in job.log.splitlines() if "(crash 1 in 21600 s" in line]
    assert "ended with status 1 (" in line and "node rank 1 (n2): Exited with exit code 1" in line
    resumed = re.findall(r"resumed from \S+/step_(\d+) at step (\d+)", job.log)
    assert len(resumed) == 1 and int(resumed[0][1]) >= 4, job.log[-3000:]
    assert state["Restarts"] == "0"  # in the same allocation, no requeue
    losses = assert_completed_after_a_crash(job, state)
    assert losses == pytest.approx(reference_losses, rel=1e-6, abs=1e-7)
    say(f"job {job.id}: worker on n2 killed, restarted at step {resumed[0][1]}, completed")


@pytest.mark.slow(
    reason="a job story on the loopback Slurm cluster: five starts of 2 ranks, four crashes",
    seconds=200,
)
def test_a_crash_after_the_last_restart_fails_the_job_in_one_line(slurm, say):
    """The first crash kills a launcher, the others a worker: each is a crash, restarted in
    the allocation until the restarts are spent."""
    job = Submitted(slurm)
    job.wait_for_step(6)
    for crash in range(1, CRASH_RESTARTS + 2):
        job.kill(1, worker=crash > 1)
        if crash <= CRASH_RESTARTS:  # wait until it trains again: rank 0 has resumed
            deadline = time.monotonic() + 120
            while job.log.count("resumed from") < crash:
                assert time.monotonic() < deadline, job.log[-3000:]
                time.sleep(0.2)
    state = job.wait_until_done()

    assert state["JobState"] == "FAILED" and state["Restarts"] == "0", job.log[-3000:]
    (first,) = [line for line in job.log.splitlines() if "(crash 1 in 21600 s" in line]
    assert "ended with status 137 (" in first and "node rank 1 (n2): Killed" in first, first
    killed = "training.launcher: rank 1 (local rank 0) on node 1 (n2) was killed by SIGKILL"
    assert job.log.count(killed) == CRASH_RESTARTS, job.log[-3000:]
    last = job.log.strip().splitlines()[-1]
    assert re.fullmatch(
        rf"slurm: job {job.id} failed: the launchers ended with status 1 \((node rank \d \(n\d\): "
        r"[^;)]*(; )?)+\), crash 4 in 21600 s after 3 restarts; not restarting",
        last,
    ), last
    assert "node rank 1 (n2): Exited with exit code 1" in last
    say(f"job {job.id}: a launcher, then workers killed: {CRASH_RESTARTS + 1} crashes: {last}")


@pytest.mark.slow(
    reason="a job story on the loopback Slurm cluster: real sbatch, srun and a rank training "
    "until Slurm's time-limit warning (a minute or more), then its requeue",
    seconds=250,
)
def test_a_job_near_its_time_limit_checkpoints_and_comes_back(slurm, say):
    """The batch shell's warning before --time ends the job: checkpoint, requeue, resume.

    The job is far too long to finish: the test stops it once it has come back. Slurm
    looks at time limits every 30 s or so, and sends the warning (here 75 s ahead of a
    2-minute limit) at the first look inside that lead: 45 to 75 s after the start, well
    after the job has begun to train, a rank training all the while. One node: the batch
    shell's signal reaching both nodes is the `--batch` stop of the story above.
    """
    job = Submitted(
        slurm,
        sbatch_options=("--time=2", "--signal=B:TERM@75"),
        job=(*JOB, "train.steps=1000000"),
        nodes=1,
    )
    try:
        wait_for_restarts(job, 1)
        deadline = time.monotonic() + 120
        while "resumed from" not in job.log:
            assert time.monotonic() < deadline, job.log[-3000:]
            time.sleep(0.5)
    finally:
        slurm.command("scancel", job.id, check=False)

    (step,) = map(int, re.findall(r"stopped at step (\d+) \(SIGTERM\); checkpoint saved", job.log))
    assert f"resumed from {job.work}/ckpt/{JOB_NAME}/step_{step:08d} at step {step}" in job.log
    assert "stopped: requeueing it; it resumes from its newest" in job.log
    say(f"job {job.id}: time-limit warning, checkpoint at step {step}, requeued, resumed")
