"""Launching real multi-process ranks from tests."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from training.contract import WORKER_VARIABLES

REPO_ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch_env(**extra: str) -> dict[str, str]:
    """This process's environment without rank variables.

    The project is installed (scripts/bootstrap: editable), so nothing is added to
    PYTHONPATH; test scripts run as modules from the repository root (see _torchrun).
    """
    env = {k: v for k, v in os.environ.items() if k not in WORKER_VARIABLES}
    env.update(extra)
    return env


def torchrun(script: Path, nproc: int, *args: str, **popen) -> subprocess.Popen:
    """Start ``script`` on ``nproc`` local ranks through torch's elastic launcher."""
    options = [f"--nproc_per_node={nproc}", f"--master_port={free_port()}"]
    return _torchrun(options, script, args, **popen)


def torchrun_nodes(script: Path, nnodes: int, *args: str) -> list[subprocess.Popen]:
    """Start ``script`` as ``nnodes`` one-rank "nodes" on this machine, one launcher each."""
    port = free_port()
    return [
        _torchrun(
            [
                f"--nnodes={nnodes}",
                f"--node_rank={node}",
                "--nproc_per_node=1",
                f"--master_port={port}",
            ],
            script,
            args,
        )
        for node in range(nnodes)
    ]


def _torchrun(options: list[str], script: Path, args: tuple[str, ...], **popen) -> subprocess.Popen:
    # As a module (python -m), from the repository root: the script imports tests.*.
    module = ".".join(script.resolve().relative_to(REPO_ROOT).with_suffix("").parts)
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--master_addr=127.0.0.1",
        *options,
        "--module",
        module,
        *args,
    ]
    return subprocess.Popen(command, env=launch_env(), cwd=REPO_ROOT, **popen)
