"""`python -m training exec -- COMMAND...`: any command as a job, on every node of it.

`gpu-stack run STACK -- torchrun ... train.py` queues such a job; the node's job watcher
(infra/node/templates/watch-jobs.py) or the Slurm batch script (one launcher per node)
runs this in the stack's image, with the same TRAIN_* environment the trainer gets. It
hands the command what a distributed script expects, and the stack's stop signals:

- Rendezvous: MASTER_ADDR, MASTER_PORT, NNODES, NODE_RANK, NPROC_PER_NODE, WORLD_SIZE, and
  torchrun's own PET_NNODES, PET_NODE_RANK, PET_MASTER_ADDR, PET_MASTER_PORT,
  PET_NPROC_PER_NODE (torchrun takes each `--option` from PET_<OPTION> when it is not
  given: torch/distributed/argparse_util.py, `env`; docs.pytorch.org/docs/stable/
  elastic/run.html), so a bare `torchrun train.py` joins the job's other nodes.
- Code: the `--code` folder, unpacked (its requirements.txt installed), is the command's
  working directory and on its PYTHONPATH (training/code.py), as for the trainer.
- Paths: CHECKPOINT_DIR (the job's own: the command saves there), DATA_PATH
  (TRAIN_DATA_PATH, where the stack puts gpu:dataS3Uri). With TRAIN_S3_URI set (the stack
  sets it for every job), CHECKPOINT_DIR is mirrored to S3 when the command ends and
  brought back before it starts on a node without the newest copy
  (training/checkpoint/folder_mirror.py): a requeue onto another node resumes too.
- Stops: a SIGTERM or SIGINT to this process (a spot notice, a budget or idle stop,
  `cancel`, Slurm's preemption) goes on to the command's whole process group; the command
  has the stack's grace period to save, then exits. Its exit status is this one's: 75
  (training.contract.ExitCode.INTERRUPTED) asks the stack to start it again later. After a
  stop, any failing status is taken as 75 too: torchrun answers a SIGTERM by stopping its
  workers and raising SignalException, so it exits 1 whatever they did (torch 2.13.0,
  torch/distributed/elastic/agent/server/api.py, SimpleElasticAgent.run: "Received %s
  death signal, shutting down workers", then `raise`), and a job stopped by the stack has
  not ended: it must run again.

docs/command-jobs.md says what such a command must do; examples/command_job.py is one.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from botocore.exceptions import BotoCoreError, ClientError

from training.checkpoint.folder_mirror import FolderMirror, MirrorError
from training.code import use_job_code
from training.contract import ExitCode
from training.environment import (
    TopologyError,
    TrainerEnv,
    check_writable_dirs,
    inherited_environment,
    read_environment,
)
from training.spec.config import ConfigError

ERROR_PREFIX = "error: "
DEFAULT_MASTER_PORT = 29500  # torchrun's


def command_environment(env: TrainerEnv, environ: Mapping[str, str], nproc: int) -> dict[str, str]:
    """`environ` with the rendezvous and the job's paths added, as the command sees them."""
    port = str(env.master_port or DEFAULT_MASTER_PORT)
    added = {
        "MASTER_ADDR": env.master_addr,
        "MASTER_PORT": port,
        "NNODES": str(env.nnodes),
        "NODE_RANK": str(env.node_rank),
        "NPROC_PER_NODE": str(nproc),
        "WORLD_SIZE": str(env.nnodes * nproc),
        "PET_NNODES": str(env.nnodes),
        "PET_NODE_RANK": str(env.node_rank),
        "PET_MASTER_ADDR": env.master_addr,
        "PET_MASTER_PORT": port,
        "PET_NPROC_PER_NODE": str(nproc),
    }
    for name, key in (("CHECKPOINT_DIR", "TRAIN_CHECKPOINT_DIR"), ("DATA_PATH", "TRAIN_DATA_PATH")):
        if key in env.config_paths:
            added[name] = env.config_paths[key]
    return {**environ, **added}


def _gpus() -> int:
    import torch  # in the image; only when TRAIN_NPROC_PER_NODE leaves the count open

    return torch.cuda.device_count() or 1


def main(argv: list[str]) -> int:
    from training.interrupt import StopFlag, spot_endpoint_from_env  # torch: in the image

    command = argv[1:] if argv[:1] == ["--"] else argv
    if not command:
        print(f"{ERROR_PREFIX}exec: give the command after --, e.g. exec -- torchrun train.py")
        return ExitCode.BAD_CONFIG
    try:
        env = read_environment()
        check_writable_dirs(env)  # CHECKPOINT_DIR is made before the command starts
    except TopologyError as error:
        print(f"{ERROR_PREFIX}{error}", file=sys.stderr)
        return ExitCode.BAD_CONFIG
    try:
        code = use_job_code(env)  # run --code: unpacked, its requirements installed
    except ConfigError as error:
        print(f"{ERROR_PREFIX}{error}", file=sys.stderr)
        return ExitCode.BAD_CONFIG
    environ = command_environment(env, inherited_environment(), env.nproc_per_node or _gpus())
    mirror = None
    if "CHECKPOINT_DIR" in environ:
        os.makedirs(environ["CHECKPOINT_DIR"], exist_ok=True)
        mirror = _mirror(env, Path(environ["CHECKPOINT_DIR"]))
    if mirror is not None and not _bring_back(mirror):
        return ExitCode.FAILED  # started without its saves, it would begin from nothing
    try:
        # A session of its own: a stop reaches torchrun and every worker it started.
        child = subprocess.Popen(command, env=environ, cwd=code, start_new_session=True)
    except OSError as error:
        print(f"{ERROR_PREFIX}exec: cannot start {command[0]!r}: {error}", file=sys.stderr)
        return ExitCode.BAD_CONFIG

    # SIGTERM and SIGINT here, or a spot notice (training/interrupt.py polls IMDS as the
    # trainer does), become one SIGTERM to the command's process group.
    stop = StopFlag(spot_endpoint=spot_endpoint_from_env(env), poll_interval_s=1.0)
    stop.start()
    forwarded = False
    while (status := child.poll()) is None:
        if stop.should_stop() and not forwarded:
            print(f"exec: {stop.reason}: SIGTERM to the command", file=sys.stderr, flush=True)
            with contextlib.suppress(ProcessLookupError):  # it has ended already
                os.killpg(child.pid, signal.SIGTERM)
            forwarded = True
        time.sleep(0.2)
    stop.close()
    # A command ended by a signal exits as a shell says so (128 + the signal).
    status = status if status >= 0 else 128 - status
    if forwarded and status not in (ExitCode.DONE, ExitCode.INTERRUPTED):
        print(f"exec: the command exited {status} after the stop: run it again (75)", flush=True)
        status = ExitCode.INTERRUPTED
    if mirror is not None:
        _copy_up(mirror)
    return status


def _bring_back(mirror: FolderMirror) -> bool:
    """S3's copy of CHECKPOINT_DIR, where it is newer than this node's; False: unreachable."""
    try:
        restored = mirror.pull()
    except (MirrorError, BotoCoreError, ClientError, OSError) as error:
        print(f"{ERROR_PREFIX}exec: cannot bring CHECKPOINT_DIR from {mirror.uri}: {error}")
        return False
    if restored is not None:
        print(f"exec: CHECKPOINT_DIR brought from {mirror.uri} ({restored} files)", flush=True)
    return True


def _copy_up(mirror: FolderMirror) -> None:
    """CHECKPOINT_DIR as the command left it, to S3; a failure is said, the status kept."""
    try:
        pushed = mirror.push()
    except (BotoCoreError, ClientError, OSError) as error:
        print(f"{ERROR_PREFIX}exec: cannot mirror CHECKPOINT_DIR to {mirror.uri}: {error}")
        return
    print(
        f"exec: CHECKPOINT_DIR mirrored to {mirror.uri} ({pushed.files} files, "
        f"{pushed.uploaded} new: {pushed.uploaded_bytes / 2**20:.1f} MiB)",
        flush=True,
    )


def _mirror(env: TrainerEnv, folder: Path) -> FolderMirror | None:
    """This node's S3 copy of CHECKPOINT_DIR, where the job has an S3 prefix."""
    if env.s3_uri is None:
        return None
    import boto3  # in the image; only for a job with an S3 prefix

    return FolderMirror(boto3.client("s3"), env.s3_uri, folder, env.node_rank)
