"""The batch script a training job runs on the Slurm cluster (templates/train.sbatch).

One template, two launch prefixes: on the cluster each node's task runs the
stack's image under Pyxis/Enroot (`srun --container-image=...`), in the tests it
runs the host's interpreter. Everything else (one launcher per node, node rank,
rendezvous, requeue, the trainer's environment) is the same text.

Pure Python: the Pulumi program renders it for the stack, the tests render and run it.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path

from infra.node.boot import _ScriptTemplate
from training.contract import DEFAULT_MASTER_PORT, UNHEALTHY_PREFIX, ExitCode
from training.health.expectation import NodeExpectation

TEMPLATE = Path(__file__).parent / "templates" / "train.sbatch"

# Inside the container: the image's own interpreter (docs/contracts.md section 3).
CONTAINER_PYTHON = "python"
# Node-local disk on the cluster's compute nodes; the S3 mirror joins the nodes' parts
# of a checkpoint and carries it to replacement nodes (docs/stack.md, "Slurm cluster").
CLUSTER_CHECKPOINT_ROOT = "/scratch/checkpoints"
# The job's log, in the folder it was submitted from; %j: the job id, the same after a requeue.
LOG_FILE = "train-%j.out"


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

        Pyxis takes `registry#repository:tag` for a registry other than Docker Hub
        (https://github.com/NVIDIA/pyxis, "Usage").
        """
        registry, _, repository = image_uri.partition("/")
        mount_list = ",".join(f"{host}:{inside}" for host, inside in mounts.items())
        return cls(
            srun_options=(
                f"--container-image={registry}#{repository}",
                f"--container-mounts={mount_list}",
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


def render_sbatch(job: BatchJob) -> str:
    """The batch script: submit it with `sbatch SCRIPT [python -m training arguments]`."""
    if job.nodes < 1:
        raise ValueError(f"a job needs at least one node, got {job.nodes}")
    values = {
        "nodes": str(job.nodes),
        "output": job.log_file,
        "master_port": str(DEFAULT_MASTER_PORT),
        "checkpoint_root": job.checkpoint_root.rstrip("/"),
        "s3_root": job.s3_root.rstrip("/"),
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
    values["requeue_exit"] = str(int(ExitCode.INTERRUPTED))
    return _ScriptTemplate(TEMPLATE.read_text()).substitute(values)
