"""Runs INSIDE a CUDA image, on a machine with NVIDIA GPUs: does the image train on them?

  docker run --rm --gpus all --ipc=host -i IMAGE python - [--expect-busbw GBPS] \\
      < images/gpu_check.py

(1) one FusedAdam step on GPU 0 with the image's pre-built op (a JIT build is refused, as
in image_check.py): the weights must change and stay finite; (2) a 2-rank NCCL all-reduce
through torch.distributed, one process per GPU (needs 2 GPUs); (3) nccl-tests'
all_reduce_perf across every GPU of the machine with data checking on: no wrong value,
its NCCL the library torch loaded, and with --expect-busbw (the catalog's figure for the
instance, infra/knowledge/data/allreduce.toml) a bus bandwidth of at least 80% of it at
the largest size, the health gate's tolerance. Prints one line per check; exits 1 naming
every failure. Standalone (the image has no `images` package).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import socket
import subprocess
import sys
import tempfile

ALL_REDUCE_PERF = "/opt/nccl-tests/bin/all_reduce_perf"
# The health gate's share of the catalog's figure (training/health/checks.py).
BUSBW_TOLERANCE = 0.8

# One rank of the 2-rank all-reduce: rank r contributes r + 1, so every element must
# come back as 1 + 2 = 3.
_RANK = """
import os, torch, torch.distributed as dist
rank = int(os.environ["RANK"])
torch.cuda.set_device(rank)
dist.init_process_group("nccl", device_id=torch.device("cuda", rank))
tensor = torch.full((1 << 20,), float(rank + 1), device="cuda")
dist.all_reduce(tensor)
torch.cuda.synchronize()
assert torch.all(tensor == 3.0).item(), tensor[:4].tolist()
dist.destroy_process_group()
"""


def fused_adam_step() -> str:
    """One FusedAdam step on GPU 0, with the pre-built op; '' when it worked, else why not."""
    import torch
    from deepspeed.ops.adam import FusedAdam
    from deepspeed.ops.op_builder.builder import OpBuilder

    def refuse(self, *args, **kwargs):
        raise RuntimeError(f"{self.name} is not pre-built: DeepSpeed would compile it")

    OpBuilder.jit_load = refuse
    model = torch.nn.Linear(256, 256).cuda()
    before = model.weight.detach().clone()
    optimizer = FusedAdam(model.parameters(), lr=1e-2)
    model(torch.randn(32, 256, device="cuda")).square().mean().backward()
    optimizer.step()
    torch.cuda.synchronize()
    if not torch.isfinite(model.weight).all():
        return "FusedAdam produced non-finite weights"
    if torch.equal(before, model.weight.detach()):
        return "FusedAdam's step left the weights unchanged"
    return ""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def two_rank_allreduce(timeout: float = 300) -> str:
    """Two processes, one GPU each, NCCL through torch.distributed; '' when both agree."""
    port = str(_free_port())
    ranks = []
    for rank in range(2):
        env = {
            **os.environ,
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": port,
        }
        ranks.append(subprocess.Popen([sys.executable, "-c", _RANK], env=env))
    codes = []
    for process in ranks:
        try:
            codes.append(process.wait(timeout=timeout))
        except subprocess.TimeoutExpired:
            process.kill()
            codes.append("timed out")
    failed = [f"rank {rank}: {code}" for rank, code in enumerate(codes) if code != 0]
    return f"2-rank NCCL all-reduce failed ({', '.join(failed)})" if failed else ""


def _values(node, key: str) -> list:
    """Every value of `key` anywhere in a JSON document (nccl-tests nests its results)."""
    if isinstance(node, dict):
        found = [node[key]] if key in node else []
        return found + [v for value in node.values() for v in _values(value, key)]
    if isinstance(node, list):
        return [v for item in node for v in _values(item, key)]
    return []


def allreduce_perf_problems(report: dict, torch_nccl: int, expect_busbw: float | None) -> list[str]:
    """What all_reduce_perf's JSON report (nccl-tests -J, src/util.cu) shows went wrong:
    wrong values, another NCCL than torch's, too little bus bandwidth at the largest size."""
    problems = []
    versions = set(_values(report, "nccl_version"))
    if versions != {torch_nccl}:
        problems.append(f"all_reduce_perf ran NCCL {sorted(versions)}, torch loads {torch_nccl}")
    # The footer's "Out of bounds values": every wrong element the data check found.
    wrong = sum(o.get("count", 0) for o in _values(report, "out_of_bounds") if isinstance(o, dict))
    if wrong:
        problems.append(f"all_reduce_perf found {wrong:g} wrong values")
    tables = [t for t in _values(report, "results") if isinstance(t, list)]
    rows = [row for table in tables for row in table if isinstance(row, dict) and "size" in row]
    if not rows:
        return [*problems, "all_reduce_perf reported no result"]
    largest = max(rows, key=lambda row: row["size"])
    busbw = max(b for b in _values(largest, "bus_bw") if isinstance(b, int | float))
    print(f"all_reduce_perf: {busbw:.1f} GB/s bus bandwidth at {largest['size']} bytes")
    if expect_busbw is not None and busbw < expect_busbw * BUSBW_TOLERANCE:
        problems.append(
            f"all_reduce_perf reached {busbw:.1f} GB/s, under {BUSBW_TOLERANCE:.0%} of the "
            f"expected {expect_busbw:g} GB/s"
        )
    return problems


def torch_nccl_code() -> int:
    """ncclGetVersion of the libnccl torch loaded (image_check.py reads it the same way)."""
    import torch.distributed  # noqa: F401  (loads libnccl)

    with open("/proc/self/maps") as maps:
        path = next(line.split()[-1] for line in maps if "libnccl.so" in line)
    code = ctypes.c_int()
    ctypes.CDLL(path).ncclGetVersion(ctypes.byref(code))
    return code.value


def run_allreduce_perf(gpus: int, binary: str = ALL_REDUCE_PERF) -> tuple[int, dict]:
    """all_reduce_perf over `gpus` GPUs from one process, 8 MiB to 1 GiB, data checked."""
    with tempfile.TemporaryDirectory() as folder:
        report = os.path.join(folder, "report.json")
        argv = [binary, "-b", "8M", "-e", "1G", "-f", "2", "-g", str(gpus), "-c", "1"]
        code = subprocess.run([*argv, "-J", report], check=False).returncode
        if not os.path.exists(report):
            return code, {}
        with open(report) as handle:
            return code, json.load(handle)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--expect-busbw", type=float, help="the catalog's all-reduce GB/s")
    args = parser.parse_args(argv)
    import torch

    gpus = torch.cuda.device_count()
    if gpus == 0:
        print("MISMATCH no GPU visible: run with --gpus all on a machine with one", file=sys.stderr)
        return 1
    print(f"{gpus} x {torch.cuda.get_device_name(0)}")
    adam = fused_adam_step()
    print(f"FusedAdam step: {adam or 'ok'}")
    problems = [adam] if adam else []
    if gpus >= 2:
        allreduce = two_rank_allreduce()
        print(f"2-rank NCCL all-reduce: {allreduce or 'ok'}")
        problems += [allreduce] if allreduce else []
    else:
        print("2-rank NCCL all-reduce: skipped (one GPU: NCCL runs one rank per GPU)")
    code, report = run_allreduce_perf(gpus)
    if code != 0 or not report:
        problems.append(f"all_reduce_perf exited {code}")
    problems += allreduce_perf_problems(report, torch_nccl_code(), args.expect_busbw)
    for problem in problems:
        print(f"MISMATCH {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
