"""`python -m training fabric`: the network between nodes, measured with the NCCL that trains.

Started on every node of a job at once, as the job itself is (TRAIN_NNODES, TRAIN_NODE_RANK,
TRAIN_MASTER_ADDR/PORT; under Slurm, one task per node), it starts one process per GPU
through torch's elastic launcher, as the trainer does, and every process:
- all-reduces 1 GiB across every GPU of every node, timed as nccl-tests times it; the
  slowest rank's time gives the bus bandwidth (algorithm bandwidth x 2(n-1)/n);
- reads what NCCL logged while it set up (NCCL_DEBUG=INFO, a file per process): the network
  it chose ("NCCL INFO Using network Libfabric": NCCL v2.29.7-1 src/init.cc:457; "Socket" is
  TCP, "IB" InfiniBand) and aws-ofi-nccl's libfabric provider ("NET/OFI Selected provider
  is efa, fabric is ...": aws-ofi-nccl v1.20.0 src/nccl_ofi_net.cpp:644, the "NET/OFI "
  prefix from include/nccl_ofi_log.h:21).
Node 0 prints one line per check against the catalog's figures: with TRAIN_EXPECT_EFA, every
rank on NCCL over EFA; with TRAIN_EXPECT_FABRIC_BUSBW_GBPS, at least 80% of it. It exits 0,
or 1 with a last line `failed: fabric: ...` (no one node is to blame: a security group that
blocks the nodes from each other, instances outside one placement group, a plugin missing).
Without GPUs the processes all-reduce 16 MiB over gloo: it shows the nodes reach each other
and measures the bandwidth; there is no NCCL network to read.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import sys
import tempfile
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path

import torch
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.launcher.api import elastic_launch

from training.contract import FAILURE_PREFIX, ExitCode
from training.environment import TrainerEnv, read_environment
from training.health import checks
from training.health.expectation import NodeExpectation
from training.launcher import launch_config, rendezvous_port, topology_from_env

WARMUP, ITERATIONS = 3, 10
# 1 GiB per GPU, as the catalog's figures were measured; without GPUs (gloo) the check only
# shows the nodes reach each other, so a size that takes a CPU a moment.
GPU_SIZE_MIB, CPU_SIZE_MIB = 1024, 16
# Two nodes that cannot reach each other fail in minutes, not after NCCL's 10-minute default.
TIMEOUT = timedelta(minutes=3)
# NCCL's own log lines (NCCL v2.29.7-1 src/debug.cc:372-386: "host:pid:tid [dev] NCCL INFO ...").
_NETWORK = re.compile(r"NCCL INFO Using network (.+?)\s*$", re.M)
_PROVIDER = re.compile(r"NCCL INFO NET/OFI Selected provider is ([^,\s]+)")
GLOO = "gloo (no GPU: NCCL not used)"


def nccl_network(log: str) -> str:
    """What one process's NCCL log says it talks over: "Libfabric (efa)", "Socket", ..."""
    network = _NETWORK.search(log)
    if network is None:
        return "unknown (NCCL logged no network)"
    provider = _PROVIDER.search(log)
    return f"{network[1]} ({provider[1]})" if provider else network[1]


def own_nccl_log(log_dir: str, pid: int) -> str:
    """What NCCL logged in process `pid`: its NCCL_DEBUG_FILE, nccl.%h.%p, which NCCL names
    with the host name up to its first dot (NCCL v2.29.7-1 src/debug.cc, getHostNameForLog);
    the folder is this node's."""
    return "".join(path.read_text() for path in sorted(Path(log_dir).glob(f"nccl.*.{pid}")))


def measure(size: int, log_dir: str) -> tuple[float, list[str]]:
    """One rank: the all-reduce's bus bandwidth (GB/s) and every rank's network."""
    import torch.distributed as dist

    cuda = torch.cuda.is_available()
    local_rank = read_environment().local_rank
    if cuda:
        torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    dist.init_process_group(
        "nccl" if cuda else "gloo", timeout=TIMEOUT, device_id=device if cuda else None
    )
    try:
        tensor = torch.ones(size // 4, device=device)  # float32, as nccl-tests -d float

        def run(times: int) -> float:
            dist.barrier()
            start = time.perf_counter()
            for _ in range(times):
                dist.all_reduce(tensor)
            if cuda:
                torch.cuda.synchronize()
            return time.perf_counter() - start

        run(WARMUP)
        seconds = torch.tensor([run(ITERATIONS) / ITERATIONS], dtype=torch.float64)
        dist.all_reduce(seconds, op=dist.ReduceOp.MAX)  # the collective is its slowest rank
        world = dist.get_world_size()
        network = GLOO
        if cuda:
            network = nccl_network(own_nccl_log(log_dir, os.getpid()))
        networks = [""] * world
        dist.all_gather_object(networks, f"{socket.gethostname()}: {network}")
        return checks.busbw_gbps(seconds.item(), size, world), networks
    finally:
        dist.destroy_process_group()


def network_check(networks: list[str], expect: NodeExpectation) -> checks.Check:
    """Every rank on NCCL over EFA where the stack attached EFA; else only reported."""
    found = sorted({network.split(": ", 1)[1] for network in networks})
    figure = f"{', '.join(found)} on {len(networks)} ranks"
    if not expect.efa_devices:
        return checks.Check("network", "ok", figure, "no EFA expected")
    off_efa = Counter(network for network in networks if not network.endswith(" (efa)"))
    if off_efa:
        hosts = "; ".join(f"{network} x{count}" for network, count in sorted(off_efa.items()))
        figure = f"{off_efa.total()} of {len(networks)} ranks not on EFA: {hosts}"
    return checks.Check("network", "failed" if off_efa else "ok", figure, "every rank on EFA")


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m training fabric")
    parser.add_argument(
        "--size-mib", type=int, help=f"all-reduced per rank (default {GPU_SIZE_MIB}: the size of "
        f"the catalog's figures; {CPU_SIZE_MIB} without a GPU)"
    )  # fmt: skip
    return parser


def main(argv: list[str], env: TrainerEnv) -> int:
    args = parser().parse_args(argv)
    topo = rendezvous_port(topology_from_env(env), env)
    size_mib = args.size_mib or (GPU_SIZE_MIB if torch.cuda.is_available() else CPU_SIZE_MIB)
    size = size_mib << 20
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="fabric-nccl-") as log_dir:
        config = launch_config(topo, "fabric", Path(log_dir) / "torchelastic")
        # Every process NCCL starts logs its setup into its own file (NCCL v2.29.7-1
        # src/debug.cc:241-285: %h host, %p pid), read back by that process.
        os.environ["NCCL_DEBUG"] = "INFO"
        os.environ["NCCL_DEBUG_SUBSYS"] = "INIT,NET"
        os.environ["NCCL_DEBUG_FILE"] = f"{log_dir}/nccl.%h.%p"
        os.environ.setdefault("OMP_NUM_THREADS", "1")  # as the trainer's launcher
        try:
            measured = elastic_launch(config, measure)(size, log_dir)
        except ChildFailedError as error:
            ranks = ", ".join(str(rank) for rank in sorted(error.failures))
            print(f"{FAILURE_PREFIX}fabric: rank {ranks} of the all-reduce across "
                  f"{topo.nnodes} nodes failed (see its error above)", file=sys.stderr)  # fmt: skip
            return ExitCode.FAILED
    if topo.node_rank != 0:
        print(f"fabric: node {topo.node_rank} took part", flush=True)
        return ExitCode.DONE
    busbw, networks = measured[0]
    ranks = f"{len(networks)} ranks on {topo.nnodes} nodes"
    results = [
        checks.bandwidth(
            "all-reduce",
            f"{busbw:.1f} GB/s bus bandwidth across {ranks}, {size_mib} MiB each",
            busbw,
            env.expect.fabric_busbw_gbps,
        ),
        network_check(networks, env.expect),
    ]
    for result in results:
        print(f"fabric: {result.line()}", flush=True)
    failed = [result.line() for result in results if result.failed]
    took = time.perf_counter() - started
    if failed:
        print(f"{FAILURE_PREFIX}fabric: {'; '.join(failed)} ({took:.1f} s)", flush=True)
        return ExitCode.FAILED
    print(f"fabric: the nodes' network is fit for training ({took:.1f} s)", flush=True)
    return ExitCode.DONE
