"""Launching real multi-process ranks from tests."""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from training.contract import WORKER_VARIABLES

REPO_ROOT = Path(__file__).resolve().parents[2]


@functools.cache
def _launch_logs() -> Path:
    """Where this process's launches keep their logs, removed when it ends.

    torch's elastic launcher makes a folder for each launch's logs and never removes it: in
    /tmp (a torchelastic_* folder) unless --log-dir names where. Made at the first launch:
    rank processes import this module too, and one killed would leave its folder behind."""
    folder = Path(tempfile.mkdtemp(prefix="multirank-launches-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


# The kernel gives a connection's local end, and a bind to port 0, a port from
# net.ipv4.ip_local_port_range (32768-60999 by default: the kernel's ip-sysctl
# documentation). A port chosen there for later use (a job's rendezvous, bound when the job
# starts and again at each restart) can meanwhile become the local end of any process's
# connection: gloo's sockets of a job on the other loopback Slurm cluster took one once, and
# the restart that needed it crashed. So the ports tests hand out come from below that
# range, each xdist worker from a slice of its own, in turn.
_BELOW_EPHEMERAL = 12_000  # ports under the range's start that tests use
_SLICES = 8  # xdist workers that can run at once without sharing a slice


def _ephemeral_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _worker_ports() -> range:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    size = _BELOW_EPHEMERAL // _SLICES
    first = _ephemeral_start() - _BELOW_EPHEMERAL + (int(worker or 0) % _SLICES) * size
    return range(first, first + size)


_next_port = os.getpid()  # where this process starts in its slice


def free_port() -> int:
    """A loopback port no one listens on now, and no connection will be given."""
    global _next_port
    ports = _worker_ports()
    for _ in range(len(ports)):
        port = ports[_next_port % len(ports)]
        _next_port += 1
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue  # in use: the next one
            return port
    raise RuntimeError(f"no free port in {ports.start}-{ports.stop - 1}")


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
        f"--log-dir={_launch_logs()}",
        *options,
        "--module",
        module,
        *args,
    ]
    return subprocess.Popen(command, env=launch_env(), cwd=REPO_ROOT, **popen)
