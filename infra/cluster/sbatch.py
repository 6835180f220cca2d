"""The batch script a training job runs on the Slurm cluster (templates/train.sbatch).

One template, two launch prefixes: on the cluster each node's task runs the
stack's image under Pyxis/Enroot (`srun --container-image=...`), in the tests it
runs the host's interpreter. Everything else (one launcher per node, node rank,
rendezvous, requeue, the trainer's environment) is the same text.

Pure Python: the Pulumi program renders it for the stack, the tests render and run it.
"""

from __future__ import annotations

import shlex
import signal
from dataclasses import dataclass, field
from pathlib import Path

from infra.cluster.config import ECR_LOGIN, KILL_WAIT_S, NODE_VERDICTS_DIR
from infra.cluster.epilog import VERDICT_FILE
from infra.node.boot import ScriptTemplate
from training.contract import (
    CRASH_RESTARTS,
    CRASH_WINDOW_S,
    DEFAULT_MASTER_PORT,
    ENV,
    HF_HOME_ENV,
    HF_TOKEN_ENV,
    UNHEALTHY_PREFIX,
    ExitCode,
)
from training.health.expectation import NodeExpectation

TEMPLATE = Path(__file__).parent / "templates" / "train.sbatch"

# Inside the container: the image's own interpreter (docs/contracts.md section 3).
CONTAINER_PYTHON = "python"
# Node-local disk on the cluster's compute nodes; the S3 mirror joins the nodes' parts
# of a checkpoint and carries it to replacement nodes (docs/stack.md, "Slurm cluster").
CLUSTER_CHECKPOINT_ROOT = "/scratch/checkpoints"
# The node's cache (TRAIN_CACHE_DIR, HF_HOME under it) on the same local disk.
CLUSTER_CACHE_DIR = "/scratch/cache"
# The job's log, in the folder it was submitted from; %j: the job id, the same after a requeue.
LOG_FILE = "train-%j.out"
# Pyxis sets the image's environment over the job's, except the names given to
# --container-env, which keep the job's value when the job has one and the image's
# otherwise (NVIDIA/pyxis pyxis_slurmstepd.c, spank_import_container_env; tests/env.bats,
# "--container-env overriding container variable"; commit
# 107519944221822ea1dace4db8e7234b2eaa4cd5; the option exists since Pyxis v0.15.0, and
# ParallelCluster's AMIs carry 0.20.0 or later: aws-parallelcluster-cookbook, the Slurm
# cookbook's attributes, default['cluster']['pyxis']['version']). The
# image sets TRAIN_CHECKPOINT_DIR=/checkpoints, so without this the job's checkpoints
# would land in the per-job container filesystem. Every trainer variable but the one the
# image owns (its CUDA's minimum driver) is the job's.
# huggingface_hub's token and cache are the job's too.
IMAGE_ENVIRONMENT = ("TRAIN_MIN_DRIVER",)
JOB_ENVIRONMENT = (
    *(name for name in ENV if name not in IMAGE_ENVIRONMENT),
    HF_TOKEN_ENV,
    HF_HOME_ENV,
)
# The job's one container on each node. Without a name Pyxis makes a container per step
# (pyxis_<job>.<step>) and removes it after: every srun (the health gate, the training step,
# each crash restart) imports and unpacks the image again. A named container is kept and
# reused by the job's later steps ("If a container with this name already exists, the
# existing container is used and the import is skipped": NVIDIA/pyxis README, v0.20.0);
# with container_scope=job, which the head node's setup sets (templates/setup-node.sh),
# its name is the job's own (pyxis_<job id>_<name>) and Pyxis removes it when the job
# ends (pyxis_slurmstepd.c and pyxis_slurmd.c, slurm_spank_job_epilog, tag v0.20.0).
CONTAINER_NAME = "train"


@dataclass(frozen=True)
class Launch:
    """How each node's task starts `python -m training`: srun options and the interpreter."""

    srun_options: tuple[str, ...]
    python: str

    @classmethod
    def host(cls, python: str) -> Launch:
        """The host's interpreter, no container (the tests' loopback cluster)."""
        return cls(srun_options=(), python=python)

    @classmethod
    def container(cls, image_uri: str, mounts: dict[str, str]) -> Launch:
        """The stack's image under Pyxis/Enroot, with host folders mounted at the same paths.

        Pyxis hands --container-image to `enroot import docker://<image>` (pyxis_slurmstepd.c,
        tag v0.20.0), whose grammar is `docker://[USER@][REGISTRY#]IMAGE[:TAG]` (NVIDIA/enroot
        doc/cmd/import.md, tag v3.4.1, the release ParallelCluster installs:
        aws-parallelcluster-cookbook, aws-parallelcluster-platform/attributes/platform.rb).
        Enroot sends the credentials file's entry for the registry only for a user
        (src/docker.sh, docker::_authenticate, `if [ -n "${user}" ]`, unchanged from v3.4.1,
        commit 4dd13f69358cbc878135354ba3eac78db4a3970f, to master, commit
        8ea147d337da60cb1c557140f3a85cdf0d620968); a user the URI leaves out is guessed
        from the credentials file only when that file can be read at that moment (v3.4.1
        docker::import, "XXX Try to infer the user"), else the pull is anonymous and ECR
        refuses it. So the URI names ECR's user, the login the node's credentials file
        gives the registry (templates/setup-node.sh). The job's trainer variables win over
        the image's (JOB_ENVIRONMENT).
        """
        registry, _, repository = image_uri.partition("/")
        mount_list = ",".join(f"{host}:{inside}" for host, inside in mounts.items())
        return cls(
            srun_options=(
                f"--container-image={ECR_LOGIN}@{registry}#{repository}",
                f"--container-name={CONTAINER_NAME}",
                f"--container-mounts={mount_list}",
                f"--container-env={','.join(JOB_ENVIRONMENT)}",
            ),
            python=CONTAINER_PYTHON,
        )


@dataclass(frozen=True)
class BatchJob:
    """What one job's script says: how many nodes, how they launch, where checkpoints go."""

    nodes: int
    launch: Launch
    checkpoint_root: str  # each run's checkpoints in a folder named after its job name
    s3_root: str = ""  # s3://bucket/prefix mirror root (one prefix per job name); "": none
    log_file: str = LOG_FILE
    # The catalog's figures for the queue's instance type, for the health gate.
    expectation: NodeExpectation = field(default_factory=NodeExpectation)
    # Where a node's verdict goes for the Epilog (infra/cluster/epilog.py) to drain it.
    node_verdicts: str = NODE_VERDICTS_DIR
    # TRAIN_CACHE_DIR (and HF_HOME under it) on the node's local disk; "": the trainer's default.
    cache_dir: str = ""
    # The stack's HF_TOKEN secret (infra/jobs/hf_token.py) and its region; "": none.
    hf_token_secret: str = ""
    region: str = ""


def render_sbatch(job: BatchJob) -> str:
    """The batch script: submit it with `sbatch SCRIPT [python -m training arguments]`."""
    if job.nodes < 1:
        raise ValueError(f"a job needs at least one node, got {job.nodes}")
    values = {
        "nodes": str(job.nodes),
        "output": job.log_file,
        "master_port": str(DEFAULT_MASTER_PORT),
        "checkpoint_root": job.checkpoint_root.rstrip("/"),
        "node_verdicts": job.node_verdicts.rstrip("/"),
        "s3_root": job.s3_root.rstrip("/"),
        "cache_dir": job.cache_dir.rstrip("/"),
        "hf_token_secret": job.hf_token_secret,
        "region": job.region,
        "stop_lead_s": str(KILL_WAIT_S),
        "stop_signal": f"B:TERM@{KILL_WAIT_S}",
        "crash_restarts": str(CRASH_RESTARTS),
        "crash_window_s": str(CRASH_WINDOW_S),
        "exit_done": str(int(ExitCode.DONE)),
        "exit_bad_config": str(int(ExitCode.BAD_CONFIG)),
        "exit_interrupted": str(int(ExitCode.INTERRUPTED)),
        "exit_failed": str(int(ExitCode.FAILED)),
        # srun's exit status for a task killed by a signal is 128 + its number.
        "killed_by_sigterm": str(128 + signal.SIGTERM),
    }
    for key, value in values.items():
        # These land inside double quotes or #SBATCH lines: nothing may end them.
        if any(char in value for char in '"$`\\\n\r '):
            raise ValueError(f"sbatch value {key}={value!r} contains a space, quote, $ or `")
    values["launch"] = shlex.join(job.launch.srun_options)
    values["python"] = shlex.quote(job.launch.python)
    values["expectations"] = "\n".join(
        f"export {name}={shlex.quote(value)}" for name, value in job.expectation.to_env().items()
    )
    values["unhealthy_prefix"] = UNHEALTHY_PREFIX.strip()
    values["verdict_file"] = VERDICT_FILE
    return ScriptTemplate(TEMPLATE.read_text()).substitute(values)
