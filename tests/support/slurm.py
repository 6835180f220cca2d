"""A real two-node Slurm cluster on loopback: munged, slurmctld and two slurmd (n1, n2),
run as ParallelCluster runs its own: slurmctld as the `slurm` user, jobs as a user who is
not root, and the stack's Epilog (infra/cluster/epilog.py) run by slurmd as root.

Debian's Slurm is built with MULTIPLE_SLURMD, so two slurmd daemons on one host,
each started with `-N NAME` and its own port, are two nodes (slurm.conf(5),
"NodeName"; https://slurm.schedmd.com/faq.html#multi_slurmd). Every daemon keeps
its state, spool, logs and pid file in one temporary folder and listens on a port
picked free for this run; the fixture stops them by pid at the end.

What ParallelCluster does that this cluster does too (aws-parallelcluster-cookbook,
aws-parallelcluster-slurm/templates/default/slurm/slurm.conf.erb, commit
f75d84c38ecfac1891e5f3e8fe2d424cc3e7448d): SlurmUser is the unprivileged `slurm` user
(Debian's slurm packages create it), SlurmdUser root, an Epilog. Jobs are submitted by
JOB_USER, whom the fixture creates when missing (CI runs as root): a job cannot do what
only Slurm's super users may (drain a node), as on the stack's cluster, where jobs run
as the OS's default user.

Each node has its own instance metadata service here (MetadataService): the Epilog and a
job's trainer ask it for a spot interruption notice, as they ask EC2's on a real node.

The `slurm` fixture gives a test its worker's cluster (one per worker that runs Slurm
stories: tests/support/suite_time.py, slurm_clusters) with every node back in service and
no spot notice pending. Clusters of parallel workers share nothing but the machine: their
own daemons, ports, folders and job ids. Under CI=true a cluster that cannot start fails the
tests; elsewhere they are skipped.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pwd
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import psutil
import pytest

from infra.cluster.config import QUEUE
from infra.cluster.epilog import render_epilog
from tests.support.tools import _unavailable, find_tool, require_tool
from tests.training.multirank import REPO_ROOT, free_port

NODES = ("n1", "n2")
# Named as the stack's queue: the head-node scripts (infra/cluster/control.py) run unchanged.
PARTITION = QUEUE
SLURM_USER = "slurm"  # slurmctld's user (SlurmUser), as on ParallelCluster
JOB_USER = "slurmjobs"  # who submits the tests' jobs: not root, not a Slurm super user
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
    "curl": "curl",  # the Epilog's metadata requests
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
# - Epilog: run by slurmd, as root, on each node a job leaves.
_SLURM_CONF = """\
ClusterName=loopback
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmUser={slurm_user}
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={root}/munge/munge.sock,cred_expire=10
StateSaveLocation={root}/ctld
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/ctld/slurmctld.pid
SlurmdPidFile={root}/spool/slurmd.%n.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.%n.log
Epilog={root}/epilog
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


class MetadataService:
    """Each node's EC2 instance metadata service, for what the stack asks of it: an IMDSv2
    session token (PUT /latest/api/token), then /latest/meta-data/spot/instance-action, 404
    until EC2 plans to reclaim the instance and then {"action": ..., "time": ...}
    (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/spot-instance-termination-notices.html).
    Node NAME's service is at `endpoint(NAME)`."""

    def __init__(self) -> None:
        self.notices: dict[str, dict[str, str]] = {}
        service = self

        class Handler(BaseHTTPRequestHandler):
            def do_PUT(self):
                if self.path.endswith("/latest/api/token") and self.headers.get(
                    "X-aws-ec2-metadata-token-ttl-seconds"
                ):
                    self._answer(200, b"loopback-token")
                else:
                    self._answer(400, b"")

            def do_GET(self):
                node, _, path = self.path.lstrip("/").partition("/")
                if self.headers.get("X-aws-ec2-metadata-token") != "loopback-token":
                    self._answer(401, b"")
                elif path == "latest/meta-data/spot/instance-action" and node in service.notices:
                    self._answer(200, json.dumps(service.notices[node]).encode())
                else:
                    self._answer(404, b"")

            def _answer(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:  # quiet
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def endpoint(self, node: str) -> str:
        return f"{self.base}/{node}"

    def give_notice(self, node: str, when: str = "2026-12-01T10:02:00Z") -> None:
        self.notices[node] = {"action": "terminate", "time": when}

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@dataclass
class SlurmCluster:
    """A running cluster: its slurm.conf, its job user, and the environment its commands
    need."""

    root: Path
    conf: Path
    metadata: MetadataService
    node_verdicts: Path  # the nodes' verdict folder (infra/cluster/epilog.py)
    user: pwd.struct_passwd = field(default_factory=lambda: pwd.getpwnam(JOB_USER))

    @property
    def env(self) -> dict[str, str]:
        """os.environ plus SLURM_CONF: what sbatch/srun/scontrol read to find the cluster."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    @property
    def home(self) -> Path:
        """JOB_USER's home here: the jobs' folders, caches and HOME."""
        return self.root / "home"

    def job_variables(self) -> dict[str, str]:
        """What a job JOB_USER submits needs in its environment beside this process's: the
        cluster, and the user's own HOME and caches."""
        return {
            "SLURM_CONF": str(self.conf),
            "HOME": str(self.home),
            "USER": JOB_USER,
            "LOGNAME": JOB_USER,
            # DeepSpeed's JIT-built ops (tests/conftest.py): the user's own copy of the cache.
            "TORCH_EXTENSIONS_DIR": str(self.home / "torch_extensions"),
        }

    def workspace(self) -> Path:
        """A new folder JOB_USER owns, for one job: its script, log, checkpoints, metrics."""
        folder = self.home / f"job-{uuid.uuid4().hex[:8]}"
        folder.mkdir()
        os.chown(folder, self.user.pw_uid, self.user.pw_gid)
        return folder

    def run(
        self, *args: str, env: dict[str, str] | None = None, as_job_user: bool = False
    ) -> subprocess.CompletedProcess:
        """Run a Slurm client command (sinfo, scontrol, ...) against this cluster, as root or,
        `as_job_user`, as JOB_USER (sbatch).

        `env` replaces this process's environment (it must hold SLURM_CONF), e.g. for
        sbatch, whose job inherits it.
        """
        user = self.user
        as_user = {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}
        return subprocess.run(
            [find_tool(args[0]) or args[0], *args[1:]],
            env=env if env is not None else self.env,
            capture_output=True,
            text=True,
            timeout=30,
            cwd=self.home if as_job_user else None,
            **(as_user if as_job_user else {}),
        )

    def command(
        self,
        *args: str,
        check: bool = True,
        env: dict[str, str] | None = None,
        as_job_user: bool = False,
    ) -> str:
        """What `run` prints; an AssertionError naming the command if it fails and `check`."""
        result = self.run(*args, env=env, as_job_user=as_job_user)
        if check and result.returncode != 0:
            raise AssertionError(f"{' '.join(args)} failed: {result.stderr.strip()}")
        return result.stdout

    def node_states(self) -> dict[str, str]:
        """Node name -> its state as sinfo prints it (idle, alloc, down*, ...)."""
        out = self.command("sinfo", "--noheader", "--Node", "--format=%N %t", check=False)
        return dict(line.split() for line in out.splitlines() if line.strip())

    def node(self, name: str) -> dict[str, str]:
        """The node's fields from `scontrol show node` (State, ...) and its Reason, whole."""
        out = self.command("scontrol", "--oneliner", "show", "node", name)
        fields = dict(re.findall(r"(\w+)=(\S*)", out))
        reason = self.command("sinfo", "--noheader", "--Node", f"--nodes={name}", "--format=%E")
        fields["Reason"] = reason.strip()
        return fields

    def job(self, job_id: str) -> dict[str, str]:
        """The job's fields from `scontrol show job` (JobState, Restarts, ExitCode, ...)."""
        out = self.command("scontrol", "--oneliner", "show", "job", job_id)
        return dict(re.findall(r"(\w+)=(\S*)", out))

    def log(self, name: str) -> str:
        path = self.root / "log" / name
        return path.read_text() if path.exists() else ""

    def back_in_service(self) -> None:
        """Every node in service again, no spot notice pending: the state a test starts in."""
        self.metadata.notices.clear()
        for node, state in self.node_states().items():
            if state.startswith(("drain", "drng", "down")):
                self.command("scontrol", "update", f"NodeName={node}", "State=RESUME", check=False)


def _job_user() -> pwd.struct_passwd:
    """JOB_USER, created (no home, no login) when this machine does not have it.

    One worker at a time: two useradd runs for one new name at once can both write it,
    with different uids, and the one /etc/passwd keeps is not always the one a worker
    saw (measured here: 3 races in 8) - its cluster's home then belongs to nobody.
    """
    with open(Path(tempfile.gettempdir()) / "slurm-loopback-user.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(JOB_USER)
        useradd = require_tool("useradd", "passwd")
        result = subprocess.run(
            [useradd, "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", JOB_USER],
            capture_output=True,
            text=True,
        )
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(JOB_USER)
    _unavailable(f"could not create the jobs' user {JOB_USER}: {result.stderr.strip()}")


def _folders(root: Path, user: pwd.struct_passwd) -> None:
    """Who may do what where: slurmctld (SLURM_USER) its state and log; JOB_USER its home;
    every user a verdict file, as on a node (setup-node.sh)."""
    slurm = pwd.getpwnam(SLURM_USER)
    for folder, owner, mode in (
        ("munge", None, 0o755),
        ("ctld", slurm, 0o755),
        ("log", slurm, 0o755),
        ("spool", None, 0o755),
        *((f"spool/{node}", None, 0o755) for node in NODES),
        ("node-verdicts", None, 0o1733),
        ("home", user, 0o755),
    ):
        path = root / folder
        path.mkdir(parents=True, exist_ok=True)
        path.chmod(mode)
        if owner is not None:
            os.chown(path, owner.pw_uid, owner.pw_gid)


# Which clusters of this machine hold the way open, and each folder's mode before: the
# clusters of parallel test workers open it together, and the last one to stop closes it.
_WAY_RECORD = Path(tempfile.gettempdir()) / "slurm-loopback-way.json"


@contextlib.contextmanager
def _way_record() -> Iterator[dict]:
    """The record ({"holders": [pid, ...], "modes": {folder: mode}}), read and written back
    under an exclusive lock."""
    with open(_WAY_RECORD.with_suffix(".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        record = {"holders": [], "modes": {}}
        with contextlib.suppress(FileNotFoundError, json.JSONDecodeError):
            record = json.loads(_WAY_RECORD.read_text())
        yield record
        _WAY_RECORD.write_text(json.dumps(record))


def _open_the_way(paths: list[Path]) -> None:
    """Let JOB_USER reach `paths` (the interpreter, the repository): execute-only permission
    for others on each folder above them that lacks it (a pyenv Python under /root, 0700),
    until the last cluster of this machine stops (`_close_the_way`)."""
    with _way_record() as record:
        for path in paths:
            for folder in reversed(path.resolve().parents):
                mode = folder.stat().st_mode
                if not mode & stat.S_IXOTH and str(folder) not in record["modes"]:
                    record["modes"][str(folder)] = stat.S_IMODE(mode)
                    folder.chmod(stat.S_IMODE(mode) | stat.S_IXOTH)
        record["holders"].append(os.getpid())


def _close_the_way() -> None:
    """This process's cluster no longer needs the way; the last holder alive puts every
    folder's mode back. A holder killed before it could say so counts as gone."""
    with _way_record() as record:
        holders = [pid for pid in record["holders"] if pid != os.getpid() and _alive(pid)]
        record["holders"] = holders
        if not holders:
            for folder, mode in record["modes"].items():
                with contextlib.suppress(OSError):
                    Path(folder).chmod(mode)
            record["modes"] = {}


def _seed_extension_cache(home: Path, user: pwd.struct_passwd) -> None:
    """JOB_USER's DeepSpeed op cache, begun from this process's (tests/conftest.py): torch
    takes a lock file in an op's build folder even to load it, so the user needs its own."""
    cache = home / "torch_extensions"
    source = os.environ.get("TORCH_EXTENSIONS_DIR")
    if source and Path(source).is_dir():
        shutil.copytree(source, cache, symlinks=True, dirs_exist_ok=True)
    cache.mkdir(exist_ok=True)
    for path in (cache, *cache.rglob("*")):
        os.chown(path, user.pw_uid, user.pw_gid, follow_symlinks=False)


@contextlib.contextmanager
def slurm_cluster(settings: tuple[str, ...] = ()) -> Iterator[SlurmCluster]:
    """Start munged, slurmctld and slurmd n1/n2 with state in a new folder; stop them at the
    end. `settings`: more slurm.conf lines, e.g. "RequeueExit=75".

    The folder is outside pytest's (which only root may enter): slurmctld, as SLURM_USER,
    and the jobs, as JOB_USER, reach into it.
    """
    tools = {name: require_tool(name, package) for name, package in _PACKAGES.items()}
    if os.geteuid() != 0:
        _unavailable("a loopback Slurm cluster runs its daemons as root (SlurmdUser=root)")
    user = _job_user()
    _open_the_way([Path(sys.executable), REPO_ROOT])
    root = Path(tempfile.mkdtemp(prefix="slurm-loopback-"))
    root.chmod(0o755)
    _folders(root, user)
    _seed_extension_cache(root / "home", user)
    metadata = MetadataService()
    epilog = root / "epilog"
    epilog.write_text(
        render_epilog(
            node_verdicts=str(root / "node-verdicts"),
            metadata_endpoint=metadata.endpoint("${SLURMD_NODENAME}"),
        )
    )
    epilog.chmod(0o755)
    nodes = "\n".join(_NODE_LINE.format(name=name, port=free_port()) for name in NODES)
    conf = root / "slurm.conf"
    conf.write_text(
        _SLURM_CONF.format(
            root=root,
            ctld_port=free_port(),
            slurm_user=SLURM_USER,
            nodes=nodes,
            settings="".join(f"{line}\n" for line in settings),
            partition=PARTITION,
            node_list=",".join(NODES),
        )
    )
    cluster = SlurmCluster(root, conf, metadata, root / "node-verdicts", user)
    pid_files = [root / "munge" / "munged.pid", root / "ctld" / "slurmctld.pid"]
    pid_files += [root / "spool" / f"slurmd.{node}.pid" for node in NODES]
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
            metadata.close()
            signal.signal(signal.SIGTERM, previous)
            shutil.rmtree(root, ignore_errors=True)
            _close_the_way()


def _interrupt(signum, _frame):
    raise KeyboardInterrupt(f"signal {signum}")


def _start(cluster: SlurmCluster, tools: dict[str, str]) -> None:
    root, conf = cluster.root, str(cluster.conf)
    munge = root / "munge"
    key = munge / "munge.key"
    _daemon([tools["mungekey"], "--create", f"--keyfile={key}", "--force"], root)
    _daemon(
        [
            tools["munged"],
            f"--key-file={key}",
            f"--socket={munge}/munge.sock",
            f"--pid-file={munge}/munged.pid",
            f"--log-file={munge}/munged.log",
            f"--seed-file={munge}/munged.seed",
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
def slurm_session() -> Iterator[SlurmCluster]:
    """The two-node cluster, shared by a test session and stopped at its end."""
    with slurm_cluster() as cluster:
        yield cluster


@pytest.fixture
def slurm(slurm_session) -> SlurmCluster:
    """The session's cluster, every node in service and no spot notice pending."""
    slurm_session.back_in_service()
    return slurm_session
