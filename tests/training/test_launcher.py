"""The launcher: topology from TRAIN_* variables, job exit code, a two-node launch."""

from __future__ import annotations

import ipaddress
import re
import socket
import subprocess
import sys

import pytest

from tests.training.jobs import TINY, job_env, run_job, start_job
from tests.training.multirank import REPO_ROOT, free_port, launch_env
from training.checkpoint.s3 import S3Mirror
from training.contract import WORKER_MODULE
from training.environment import TopologyError, TrainerEnv
from training.launcher import _job_exit_code, failed_worker_line, topology_from_env


def test_topology_defaults_to_one_cpu_node_with_two_workers():
    topo = topology_from_env(TrainerEnv.from_environ({}))
    assert (topo.nnodes, topo.node_rank, topo.nproc_per_node) == (1, 0, 2)
    assert (topo.master_addr, topo.master_port, topo.world_size) == ("127.0.0.1", 29500, 2)


def test_multi_node_topology_from_the_stack_variables():
    topo = topology_from_env(
        TrainerEnv.from_environ(
            {
                "TRAIN_NNODES": "4",
                "TRAIN_NODE_RANK": "3",
                "TRAIN_NPROC_PER_NODE": "8",
                "TRAIN_MASTER_ADDR": "10.0.1.7",
                "TRAIN_MASTER_PORT": "29600",
            }
        )
    )
    assert topo.world_size == 32
    assert (topo.node_rank, topo.master_addr, topo.master_port) == (3, "10.0.1.7", 29600)


@pytest.mark.parametrize(
    ("env", "words"),
    [
        ({"TRAIN_NNODES": "two"}, "TRAIN_NNODES = 'two' is not an integer"),
        ({"TRAIN_NNODES": "2", "TRAIN_NODE_RANK": "2"}, "TRAIN_NODE_RANK = 2 is outside 0..1"),
        ({"TRAIN_NPROC_PER_NODE": "0"}, "TRAIN_NPROC_PER_NODE = 0: give the workers"),
        ({"TRAIN_NNODES": "0"}, "TRAIN_NNODES = 0: give the nodes in the job, at least 1"),
    ],
)
def test_bad_topology_is_refused(env, words):
    with pytest.raises(TopologyError, match=re.escape(words)):
        TrainerEnv.from_environ(env)


@pytest.mark.parametrize(
    ("codes", "job"),
    [
        ([75], 75),
        ([75, 75], 75),
        ([75, -15], 75),  # one rank checkpointed and exited, the other was stopped
        ([1, 75], 1),
        ([-9], 1),
        ([1], 1),
        ([2, 1], 2),
    ],
)
def test_job_exit_code_from_worker_codes(codes, job):
    assert _job_exit_code(codes) == job


@pytest.mark.parametrize(
    ("codes", "job"),
    [
        ([-15, -15], 75),  # stopped while starting: nothing trained, nothing lost
        ([75, -15], 75),
        ([1, -15], 1),  # a real failure stays one
        ([2, -15], 2),
    ],
)
def test_job_exit_code_after_a_stop_request(codes, job):
    assert _job_exit_code(codes, stop_requested=True) == job


@pytest.mark.slow(reason="a 2-rank job whose workers fail after the launcher's checks", seconds=90)
@pytest.mark.multiprocess
def test_a_failing_worker_makes_the_job_exit_1(tmp_path):
    """The user's model raises in the workers (after the launcher's checks passed)."""
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    job = run_job(
        tmp_path,
        "model.builder=examples.custom_model.model:build",
        "model.options={hidden_size = -1}",
        env=job_env(tmp_path, TMPDIR=str(temporary)),
    )
    assert job.returncode == 1
    # The launcher leaves nothing in the temporary folder: its heartbeats nor torch's
    # per-launch folders, which hold the workers' error files it read.
    assert list(temporary.iterdir()) == []
    assert "Traceback" in job.stderr and "hidden_size" in job.stderr
    assert "a worker failed" in job.stderr
    # The launcher names each failed worker in one line: rank, node, status, its error.
    for rank in (0, 1):
        assert re.search(
            rf"rank {rank} \(local rank {rank}\) on node 0 \(\S+\) exited with status 1: "
            r"RuntimeError: .*negative dimension",
            job.stderr,
        ), job.stderr[-2000:]
    # Its last line says why, for whoever started it (the node's job watcher keeps it).
    last = job.stderr.strip().splitlines()[-1]
    assert re.fullmatch(
        r"failed: rank \d \(local rank \d\) on node 0 \(\S+\) exited with status 1: "
        r"RuntimeError: .*negative dimension.*",
        last,
    ), last


def host_address() -> str:
    """This machine's address on its network (not loopback), or skip."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # UDP: picks the outbound address, sends nothing
        except OSError:
            pytest.skip("no network interface besides loopback")
        address = probe.getsockname()[0]
    if ipaddress.ip_address(address).is_loopback:
        pytest.skip("no network interface besides loopback")
    return address


@pytest.mark.multiprocess
@pytest.mark.slow(reason="two launchers of 1 rank each meet over the host's address", seconds=90)
def test_two_nodes_meet_as_the_stack_addresses_them(tmp_path, s3_uri):
    """Node 0 is told 127.0.0.1 and the other node node 0's address (infra.components.compute):
    node 0's rendezvous store must answer on every interface. Each node keeps its own
    checkpoint disk; the S3 mirror (always set by the stack) holds the whole checkpoint."""
    port = str(free_port())
    nodes = []
    for rank, master in enumerate(("127.0.0.1", host_address())):
        env = job_env(
            tmp_path / f"node{rank}" / "output",
            TRAIN_NNODES="2",
            TRAIN_NODE_RANK=str(rank),
            TRAIN_NPROC_PER_NODE="1",
            TRAIN_MASTER_ADDR=master,
            TRAIN_CHECKPOINT_DIR=str(tmp_path / f"node{rank}" / "checkpoints"),
            TRAIN_S3_URI=s3_uri,
        )
        env["TRAIN_MASTER_PORT"] = port
        overrides = (*TINY, "train.steps=4", "checkpoint.every_steps=4")
        nodes.append(start_job(tmp_path, *overrides, env=env))
    try:
        outputs = [node.communicate(timeout=240) for node in nodes]
    finally:
        for node in nodes:
            node.kill()  # a node still waiting for the other one (no-op once exited)
    for node, (_, stderr) in zip(nodes, outputs, strict=True):
        assert node.returncode == 0, stderr[-3000:]
    assert "world size 2" in outputs[0][1]
    assert S3Mirror.from_uri(s3_uri).latest_tag() == "step_00000004"


def test_a_failed_worker_is_named_by_rank_node_and_how_it_ended():
    node = TrainerEnv.from_environ({"SLURMD_NODENAME": "n2"}).node_name
    assert failed_worker_line(3, 1, -9, 1, node) == (
        "rank 3 (local rank 1) on node 1 (n2) was killed by SIGKILL"
    )
    assert (
        failed_worker_line(0, 0, 1, 0, node)
        == "rank 0 (local rank 0) on node 0 (n2) exited with status 1"
    )
    assert failed_worker_line(2, 0, -40, 0, node).endswith("was killed by signal 40")


def test_the_worker_entry_point_refuses_to_start_without_the_launcher():
    result = subprocess.run(
        [sys.executable, "-m", WORKER_MODULE],
        cwd=REPO_ROOT,
        env=launch_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert result.stderr.endswith(
        "error: python -m training.worker is one rank of a job, started by the launcher "
        "(RANK is unset): run python -m training\n"
    )


def test_a_rank_whose_peer_failed_first_points_at_the_peer_s_reason(tmp_path):
    from training.launcher import peer_error, record_worker_error

    assert peer_error(tmp_path, 1) is None and peer_error(None, 1) is None
    record_worker_error(tmp_path, 1, "its own")
    assert peer_error(tmp_path, 1) is None  # its own reason is not a peer's
    record_worker_error(tmp_path, 0, "no space left on the disk holding /data/runs/x: free some")
    assert peer_error(tmp_path, 1) == "no space left on the disk holding /data/runs/x: free some"


def test_a_build_lock_left_by_a_worker_killed_while_it_built_is_removed(tmp_path):
    # torch's FileBaton lock in <cache>/<python>_<device>/<op>/lock: the next start would wait
    # on it forever. Only the ops the killed workers were building are unlocked.
    from training.launcher import release_op_build_locks

    marks, cache = tmp_path / "heartbeats", tmp_path / "torch_extensions"
    marks.mkdir()
    for op in ("deepspeed_shm_comm", "cpu_adam"):
        (cache / "py311_cpu" / op).mkdir(parents=True)
        (cache / "py311_cpu" / op / "lock").touch()
    (marks / "rank-0.op-build").write_text("deepspeed_shm_comm")
    release_op_build_locks(marks, cache)
    assert not (cache / "py311_cpu" / "deepspeed_shm_comm" / "lock").exists()
    assert (cache / "py311_cpu" / "cpu_adam" / "lock").exists()  # nobody was building it
