"""A real two-node Slurm cluster on loopback: munged, slurmctld and two slurmd (n1, n2).

Debian's Slurm is built with MULTIPLE_SLURMD, so two slurmd daemons on one host,
each started with `-N NAME` and its own port, are two nodes (slurm.conf(5),
"NodeName"; https://slurm.schedmd.com/faq.html#multi_slurmd). Every daemon keeps
its state, spool, logs and pid file in one temporary folder and listens on a port
picked free for this run; the fixture stops them by pid at the end.

Start it with the `slurm_cluster` fixture (tests/infra/cluster/conftest.py). Under
CI=true a cluster that cannot start fails the tests; elsewhere they are skipped.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from infra.cluster.config import QUEUE
from tests.support.tools import _unavailable, find_tool, require_tool
from tests.training.multirank import free_port

NODES = ("n1", "n2")
# Named as the stack's queue: the head-node scripts (infra/cluster/control.py) run unchanged.
PARTITION = QUEUE
# Debian package of each daemon and command the cluster needs.
_PACKAGES = {
    "munged": "munge",
    "mungekey": "munge",
    "slurmctld": "slurmctld",
    "slurmd": "slurmd",
    "sinfo": "slurm-client",
    "sbatch": "slurm-client",
    "scontrol": "slurm-client",
    "scancel": "slurm-client",
    "squeue": "slurm-client",
}
_START_TIMEOUT_S = 30

# What slurm.conf(5) says each line does, for the lines a test relies on:
# - no RequeueExit: the batch script requeues a job that checkpointed and stopped itself,
#   so the tests show it needs no slurm.conf setting the project does not control.
# - AuthInfo cred_expire=10: a requeued job may start again cred_expire + 1 s after it
#   ended (default 120 s), so a requeue costs the tests 11 s instead of two minutes.
# - ReturnToService=2: a node set DOWN rejoins as soon as it is set back (RESUME).
# - KillWait=30: seconds between a job's SIGTERM and SIGKILL when Slurm ends it,
#   time for the trainer's checkpoint.
_SLURM_CONF = """\
ClusterName=loopback
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={root}/munge.sock,cred_expire=10
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.%n.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
ReturnToService=2
SlurmdTimeout=30
KillWait=30
{settings}{nodes}
PartitionName={partition} Nodes={node_list} Default=YES MaxTime=INFINITE State=UP
"""
_NODE_LINE = (
    "NodeName={name} NodeHostname=localhost NodeAddr=127.0.0.1 Port={port} CPUs=2 RealMemory=1000"
)


@dataclass
class SlurmCluster:
    """A running cluster: its slurm.conf, and the environment its commands need."""

    root: Path
    conf: Path

    @property
    def env(self) -> dict[str, str]:
        """os.environ plus SLURM_CONF: what sbatch/srun/scontrol read to find the cluster."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def command(self, *args: str, check: bool = True, env: dict[str, str] | None = None) -> str:
        """Run a Slurm client command (sinfo, scontrol, ...) against this cluster.

        `env` replaces this process's environment (it must hold SLURM_CONF), e.g. for
        sbatch, whose job inherits it.
        """
        result = subprocess.run(
            [find_tool(args[0]) or args[0], *args[1:]],
            env=env if env is not None else self.env,
            capture_output=True,
            text=True,
            timeout=30,
        )
        if check and result.returncode != 0:
            raise AssertionError(f"{' '.join(args)} failed: {result.stderr.strip()}")
        return result.stdout

    def node_states(self) -> dict[str, str]:
        """Node name -> its state as sinfo prints it (idle, alloc, down*, ...)."""
        out = self.command("sinfo", "--noheader", "--Node", "--format=%N %t", check=False)
        return dict(line.split() for line in out.splitlines() if line.strip())

    def job(self, job_id: str) -> dict[str, str]:
        """The job's fields from `scontrol show job` (JobState, Restarts, ExitCode, ...)."""
        out = self.command("scontrol", "--oneliner", "show", "job", job_id)
        return dict(re.findall(r"(\w+)=(\S*)", out))

    def log(self, name: str) -> str:
        path = self.root / "log" / name
        return path.read_text() if path.exists() else ""


@contextlib.contextmanager
def slurm_cluster(root: Path, settings: tuple[str, ...] = ()) -> Iterator[SlurmCluster]:
    """Start munged, slurmctld and slurmd n1/n2 with state in `root`; stop them at the end.

    `settings`: more slurm.conf lines, e.g. "RequeueExit=75".
    """
    tools = {name: require_tool(name, package) for name, package in _PACKAGES.items()}
    if os.geteuid() != 0:
        _unavailable("a loopback Slurm cluster runs its daemons as root (SlurmdUser=root)")
    for folder in ("state", "log", *(f"spool/{node}" for node in NODES)):
        (root / folder).mkdir(parents=True, exist_ok=True)
    nodes = "\n".join(_NODE_LINE.format(name=name, port=free_port()) for name in NODES)
    conf = root / "slurm.conf"
    conf.write_text(
        _SLURM_CONF.format(
            root=root,
            ctld_port=free_port(),
            nodes=nodes,
            settings="".join(f"{line}\n" for line in settings),
            partition=PARTITION,
            node_list=",".join(NODES),
        )
    )
    cluster = SlurmCluster(root=root, conf=conf)
    pid_files = [root / "munged.pid", root / "slurmctld.pid"]
    pid_files += [root / f"slurmd.{node}.pid" for node in NODES]
    # pytest ends on SIGTERM without running finalizers: make it an interrupt, which
    # it does clean up after, so that no daemon outlives the session.
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        _start(cluster, tools)
        yield cluster
    finally:
        try:
            _cancel_jobs(cluster)
        finally:
            _stop(pid_files)
            signal.signal(signal.SIGTERM, previous)


def _interrupt(signum, _frame):
    raise KeyboardInterrupt(f"signal {signum}")


def _start(cluster: SlurmCluster, tools: dict[str, str]) -> None:
    root, conf = cluster.root, str(cluster.conf)
    key = root / "munge.key"
    _daemon([tools["mungekey"], "--create", f"--keyfile={key}", "--force"], root)
    _daemon(
        [
            tools["munged"],
            f"--key-file={key}",
            f"--socket={root}/munge.sock",
            f"--pid-file={root}/munged.pid",
            f"--log-file={root}/munged.log",
            f"--seed-file={root}/munged.seed",
            "--force",
        ],
        root,
    )
    # -i: ignore saved state from an earlier run (there is none; the folder is new).
    _daemon([tools["slurmctld"], "-f", conf, "-i"], root)
    for node in NODES:
        _daemon([tools["slurmd"], "-f", conf, "-N", node], root)

    deadline = time.monotonic() + _START_TIMEOUT_S
    while True:
        states = cluster.node_states()
        if all(states.get(node) == "idle" for node in NODES):
            return
        if time.monotonic() > deadline:
            logs = "\n".join(
                cluster.log(name)[-1500:]
                for name in ("slurmctld.log", *(f"slurmd.{n}.log" for n in NODES))
            )
            _unavailable(
                f"the loopback Slurm nodes are not idle after "
                f"{_START_TIMEOUT_S} s ({states}):\n{logs}"
            )
        time.sleep(0.5)


def _cancel_jobs(cluster: SlurmCluster) -> None:
    """Cancel what still runs and wait for it to end, so no job step outlives its slurmd."""
    with contextlib.suppress(AssertionError, subprocess.SubprocessError):
        cluster.command("scancel", "--full", f"--partition={PARTITION}", check=False)
        deadline = time.monotonic() + 60  # KillWait (30 s) and then some
        while cluster.command("squeue", "--noheader", check=False).strip():
            if time.monotonic() > deadline:
                break
            time.sleep(0.5)


def _daemon(command: list[str], root: Path) -> None:
    """Run a daemon's start command; it forks into the background and writes its pid file."""
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=30, env={**os.environ}, cwd=root
    )
    if result.returncode != 0:
        _unavailable(f"{' '.join(command)} failed: {result.stderr.strip()}")


def _stop(pid_files: list[Path]) -> None:
    """SIGTERM every daemon by its pid file (slurmd first, munged last), then wait.

    A job step's slurmstepd is a slurmd's child that can outlive it (a node set DOWN
    leaves its step behind): the daemons' descendants are stopped too, by pid.
    """
    daemons = []
    for path in reversed(pid_files):
        with contextlib.suppress(FileNotFoundError, ValueError):
            daemons.append(int(path.read_text().split()[0]))
    pids = [*daemons, *_descendants(daemons)]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 20
    for pid in pids:
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _descendants(pids: list[int]) -> list[int]:
    found = []
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            found += [child.pid for child in psutil.Process(pid).children(recursive=True)]
    return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A daemon that exited but whose parent has not reaped it is a zombie: gone.
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    return False


@pytest.fixture(scope="session")
def slurm(tmp_path_factory) -> Iterator[SlurmCluster]:
    """The two-node cluster, shared by a test session and stopped at its end."""
    with slurm_cluster(tmp_path_factory.mktemp("slurm")) as cluster:
        yield cluster
