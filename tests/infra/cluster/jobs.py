"""Training jobs submitted to the loopback Slurm cluster (tests/support/slurm.py).

Each job is infra/cluster/templates/train.sbatch in its host-launch form: one
`python -m training` launcher per node, one gloo rank each (2 nodes x 1 rank),
checkpoints in a folder both nodes share. The cluster's job user submits it, from a
folder of its own (SlurmCluster.workspace), as the stack's jobs run as a user who is not
root.
"""

from __future__ import annotations

import sys
import time

import psutil

from infra.cluster.sbatch import BatchJob, Launch, render_sbatch
from tests.support.slurm import NODES, SlurmCluster
from tests.training.jobs import TINY, read_metrics
from tests.training.multirank import free_port, launch_env
from training.contract import WORKER_MODULE

# Enough steps that a stop sent after step 3 finds the job still training: these steps
# take about 20 ms each here, so the job runs for seconds, not tenths of one.
STEPS = 240
# Dropout on, so a resumed run only matches if the RNG state came back; a periodic
# checkpoint every 4 steps for the node loss, which leaves no time for a stop checkpoint.
JOB = (*TINY, "zero.stage=2", f"train.steps={STEPS}", "checkpoint.every_steps=4")
JOB_TIMEOUT_S = 240
JOB_NAME = "train"  # the script's default: checkpoints in ckpt/train, metrics in runs/train
DONE_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "BOOT_FAIL"}


class Submitted:
    """One submitted job: its id, folders and log."""

    def __init__(
        self,
        cluster: SlurmCluster,
        name: str = JOB_NAME,
        s3_root: str = "",
        launch: Launch | None = None,
        sbatch_options: tuple[str, ...] = (),
        job: tuple[str, ...] = JOB,
        nodes: int = len(NODES),
        **env: str,
    ):
        self.cluster, self.name = cluster, name
        self.work = work = cluster.workspace()
        script = work / "train.sbatch"
        script.write_text(
            render_sbatch(
                BatchJob(
                    nodes=nodes,
                    launch=launch or Launch.host(sys.executable),
                    checkpoint_root=str(work / "ckpt"),
                    s3_root=s3_root,
                    node_verdicts=str(cluster.node_verdicts),
                )
            )
        )
        env = launch_env(
            **cluster.job_variables(),
            TRAIN_NPROC_PER_NODE="1",
            TRAIN_MASTER_PORT=str(free_port()),
            TRAIN_SPOT_ENDPOINT="",  # no metadata service here: do not poll one
            **env,
        )
        overrides = [arg for override in job for arg in ("--set", override)]
        out = cluster.command(
            "sbatch",
            "--parsable",
            f"--chdir={work}",
            f"--job-name={name}",
            *sbatch_options,
            str(script),
            *overrides,
            env=env,
            as_job_user=True,
        )
        self.id = out.strip().split(";")[0]

    @property
    def log(self) -> str:
        path = self.work / f"train-{self.id}.out"
        return path.read_text() if path.exists() else ""

    @property
    def metrics(self) -> list[dict]:
        return read_metrics(self.work / "runs" / self.name)

    def state(self) -> dict[str, str]:
        return self.cluster.job(self.id)

    def training_process(self, node_rank: int, *, worker: bool) -> psutil.Process | None:
        """This job's launcher (worker=False) or worker of rank 0 on a node, if it runs now.

        Found by what Slurm and torch put in their environment: the cluster (SLURM_CONF:
        parallel workers run clusters whose job ids overlap), the job id and node rank
        (srun), RANK for a worker (torch's launcher).
        """
        for process in psutil.process_iter(["cmdline"]):
            try:
                # python -m training (the launcher) or training.worker: not srun or a shell
                # that has it in its arguments
                if (process.info["cmdline"] or [])[1:3] not in (
                    ["-m", "training"],
                    ["-m", WORKER_MODULE],
                ):
                    continue
                env = process.environ()
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            if (
                env.get("SLURM_CONF") == str(self.cluster.conf)
                and env.get("SLURM_JOB_ID") == self.id
                and env.get("SLURM_NODEID") == str(node_rank)
                and ("RANK" in env) == worker
            ):
                return process
        return None

    def kill(self, node_rank: int, *, worker: bool) -> int:
        """SIGKILL this job's launcher or worker on a node once it runs: its pid."""
        deadline = time.monotonic() + JOB_TIMEOUT_S
        while (process := self.training_process(node_rank, worker=worker)) is None:
            assert time.monotonic() < deadline, f"no process to kill:\n{self.log[-3000:]}"
            time.sleep(0.1)
        process.kill()
        return process.pid

    def wait_for_step(self, step: int) -> None:
        """Until rank 0 has logged `step` (the job trains on both nodes)."""
        deadline = time.monotonic() + JOB_TIMEOUT_S
        while not self.metrics or self.metrics[-1]["step"] < step:
            state = self.state()["JobState"]
            assert state not in DONE_STATES, f"job ended ({state}):\n{self.log[-3000:]}"
            assert time.monotonic() < deadline, f"no step {step}:\n{self.log[-3000:]}"
            time.sleep(0.2)

    def wait_until_running(self) -> str:
        """Until Slurm has started the job: the node(s) it runs on."""
        deadline = time.monotonic() + JOB_TIMEOUT_S
        while (state := self.state())["JobState"] != "RUNNING":
            assert state["JobState"] not in DONE_STATES, f"{state}\n{self.log[-3000:]}"
            assert time.monotonic() < deadline, f"not started: {state}"
            time.sleep(0.2)
        return state["NodeList"]

    def wait_until_done(self) -> dict[str, str]:
        deadline = time.monotonic() + JOB_TIMEOUT_S
        while (state := self.state())["JobState"] not in DONE_STATES:
            assert time.monotonic() < deadline, f"{state['JobState']}:\n{self.log[-3000:]}"
            time.sleep(0.5)
        return state


def assert_completed(job: Submitted, state: dict) -> list[float]:
    """The job ended with exit 0, one record per step: its losses."""
    assert state["JobState"] == "COMPLETED" and state["ExitCode"] == "0:0", job.log[-3000:]
    records = job.metrics
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))  # none twice or missing
    return [r["loss"] for r in records]


def assert_completed_after_a_crash(job: Submitted, state: dict) -> list[float]:
    """As assert_completed, for a run that crashed and started again in place: steps it had
    logged past its last checkpoint are trained, and logged, again; each step's last
    record counts."""
    assert state["JobState"] == "COMPLETED" and state["ExitCode"] == "0:0", job.log[-3000:]
    losses = {r["step"]: r["loss"] for r in job.metrics}
    assert sorted(losses) == list(range(1, STEPS + 1))
    return [losses[step] for step in range(1, STEPS + 1)]
