"""The fabric check: its reading of NCCL's log, its verdicts, and a real run of two "nodes"
on this machine (gloo on CPU: the bandwidth is measured, no NCCL network is)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from tests.support.preloaded import run_module
from tests.training.multirank import free_port, launch_env
from training.contract import ExitCode
from training.fabric import GLOO, nccl_network, network_check, own_nccl_log
from training.health.expectation import NodeExpectation

# Lines as NCCL v2.29.7-1 writes them (src/debug.cc: "host:pid:tid [dev] NCCL INFO ...") with
# aws-ofi-nccl v1.20.0's provider line (src/nccl_ofi_net.cpp, "NET/OFI " prefix).
EFA_LOG = """\
ip-10-1-2-3:41:41 [0] NCCL INFO NCCL_DEBUG_SUBSYS set by environment to INIT,NET.
ip-10-1-2-3:41:41 [0] NCCL INFO NET/OFI Initializing aws-ofi-nccl 1.20.0
ip-10-1-2-3:41:41 [0] NCCL INFO NET/OFI Selected provider is efa, fabric is efa (found 4 nics)
ip-10-1-2-3:41:41 [0] NCCL INFO Using network Libfabric
"""
SOCKET_LOG = """\
ip-10-1-2-4:977:977 [3] NCCL INFO NET/Plugin: Could not find: libnccl-net-ofi.so.
ip-10-1-2-4:977:977 [3] NCCL INFO NET/Socket : Using [0]ens5:10.1.2.4<0>
ip-10-1-2-4:977:977 [3] NCCL INFO Using network Socket
"""


def test_the_network_each_process_chose_is_read_from_its_nccl_log():
    assert nccl_network(EFA_LOG) == "Libfabric (efa)"
    assert nccl_network(SOCKET_LOG) == "Socket"
    assert nccl_network("") == "unknown (NCCL logged no network)"


def test_each_process_reads_the_log_nccl_named_after_its_pid(tmp_path):
    # NCCL_DEBUG_FILE=<folder>/nccl.%h.%p, as NCCL expands it: the host up to its first dot.
    (tmp_path / "nccl.ip-10-1-2-3.4021").write_text(EFA_LOG)
    (tmp_path / "nccl.ip-10-1-2-3.40210").write_text(SOCKET_LOG)
    assert own_nccl_log(str(tmp_path), 4021) == EFA_LOG
    assert own_nccl_log(str(tmp_path), 4022) == ""


def test_every_rank_must_be_on_efa_where_the_stack_attached_it():
    efa = NodeExpectation(efa_devices=4)
    on_efa = [f"ip-10-1-2-{node}: Libfabric (efa)" for node in (3, 3, 5, 5)]
    assert network_check(on_efa, efa).line() == (
        "network: ok: Libfabric (efa) on 4 ranks (threshold: every rank on EFA)"
    )
    mixed = [*on_efa[:2], "ip-10-1-2-4: Socket", "ip-10-1-2-4: Socket"]
    assert network_check(mixed, efa).line() == (
        "network: failed: 2 of 4 ranks not on EFA: ip-10-1-2-4: Socket x2 "
        "(threshold: every rank on EFA)"
    )
    # Without EFA (a g5 cluster), TCP is what there is: reported, not failed.
    assert not network_check(mixed, NodeExpectation()).failed


def two_nodes(*args: str, tmp: Path, **expect: str) -> list:
    """`python -m training fabric ARGS` on two one-rank "nodes" of this machine at once, each
    with `tmp` as its temporary folder."""
    port = str(free_port())
    results = [None, None]

    def node(rank: int) -> None:
        env = launch_env(
            TRAIN_NNODES="2", TRAIN_NODE_RANK=str(rank), TRAIN_NPROC_PER_NODE="1",
            TRAIN_MASTER_ADDR="127.0.0.1", TRAIN_MASTER_PORT=port, TMPDIR=str(tmp), **expect,
        )  # fmt: skip
        results[rank] = run_module("training", ["fabric", *args], env=env, timeout=120)

    threads = [threading.Thread(target=node, args=(rank,)) for rank in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


@pytest.mark.multiprocess
def test_two_nodes_all_reduce_and_node_0_holds_them_to_the_catalog(tmp_path):
    first, second = two_nodes("--size-mib", "4", tmp=tmp_path)
    assert (first.returncode, second.returncode) == (ExitCode.DONE, ExitCode.DONE), first.stderr
    lines = first.stdout.splitlines()
    assert lines[0].startswith("fabric: all-reduce: ok: ")
    assert "GB/s bus bandwidth across 2 ranks on 2 nodes, 4 MiB each" in lines[0]
    assert lines[1].startswith(f"fabric: network: ok: {GLOO} on 2 ranks")
    assert second.stdout.strip() == "fabric: node 1 took part"

    # A p4d cluster's figures: EFA on every rank, 80% of 76 GB/s. Gloo over loopback has
    # neither, and both are named in the one line that says why.
    first, second = two_nodes(
        "--size-mib", "4", tmp=tmp_path, TRAIN_EXPECT_EFA="4", TRAIN_EXPECT_FABRIC_BUSBW_GBPS="76"
    )
    assert first.returncode == ExitCode.FAILED
    last = first.stdout.splitlines()[-1]
    assert last.startswith("failed: fabric: all-reduce: failed: ")
    assert "(threshold: >= 60.8 GB/s, 80% of 76)" in last
    assert "network: failed: 2 of 2 ranks not on EFA" in last
    # Nothing is left in the temporary folder: NCCL's logs nor torch's per-launch folders.
    assert list(tmp_path.iterdir()) == []
