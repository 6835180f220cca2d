"""`python -m training health`: refuse a bad node before a job spends money on it.

Runs every check in training/health/checks.py, prints one line each (what it measured,
against what), and exits 0 when the node is fit, or ExitCode.NODE_UNHEALTHY with a last
line `unhealthy: <the failed checks>` that the boot unit sends to the alert topic and the
Slurm job writes as the node's drain reason. Meant to take well under 3 minutes on an
8-GPU node: the all-reduce moves a few GiB, DCGM runs its quick level only.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from typing import Any

from training.contract import UNHEALTHY_PREFIX, ExitCode
from training.health import checks
from training.health.expectation import NodeExpectation

log = logging.getLogger(__name__)

# Per GPU: large enough to reach the bus bandwidth plateau nccl-tests reports at 1 GiB
# (https://github.com/NVIDIA/nccl/issues/527: 230 GB/s on a p4d at 1 GiB), small enough
# for a 24 GiB A10G.
ALLREDUCE_BYTES = 1 << 30
ALLREDUCE_WARMUP, ALLREDUCE_ITERATIONS = 3, 10


def open_nvml() -> Any | None:
    """pynvml, initialised, or None where there is no NVIDIA driver or no GPU."""
    try:
        import pynvml

        pynvml.nvmlInit()
        if pynvml.nvmlDeviceGetCount() == 0:
            return None
    except Exception:
        return None
    return pynvml


def measure_allreduce(gpu_count: int) -> float:
    """Bus bandwidth (GB/s) of NCCL all-reduces across all local GPUs from one process
    (torch.cuda.nccl: one communicator over the listed devices)."""
    import torch
    import torch.cuda.nccl as nccl

    count = ALLREDUCE_BYTES // 4
    tensors = [torch.ones(count, device=f"cuda:{index}") for index in range(gpu_count)]

    def run(times: int) -> None:
        for _ in range(times):
            nccl.all_reduce(tensors)
        for index in range(gpu_count):
            torch.cuda.synchronize(index)

    run(ALLREDUCE_WARMUP)
    start = time.perf_counter()
    run(ALLREDUCE_ITERATIONS)
    seconds = (time.perf_counter() - start) / ALLREDUCE_ITERATIONS
    return checks.busbw_gbps(seconds, ALLREDUCE_BYTES, gpu_count)


def run_checks(
    expect: NodeExpectation,
    min_driver: str | None,
    nvml: Any | None,
    measure: Callable[[int], float] | None = None,
) -> list[checks.Check]:
    """Every check, in order; the XID listener spans the ones that load the GPUs."""
    measure = measure or measure_allreduce
    xids = checks.XidWatch(nvml)
    gpu_count = nvml.nvmlDeviceGetCount() if nvml is not None else 0
    return [
        checks.driver(min_driver, nvml),
        checks.gpus(expect, nvml),
        checks.memory_errors(nvml),
        checks.dcgm_diag(nvml),
        checks.allreduce(
            expect,
            (lambda: measure(gpu_count)) if nvml is not None else None,
            gpu_count,
        ),
        xids.check(),
        checks.efa(expect),
    ]


def main(
    argv: list[str], expect: NodeExpectation, min_driver: str | None, nvml: Any | None = None
) -> int:
    """The gate on this node: `expect` and `min_driver` as the trainer's environment gives them."""
    if argv:
        print(f"error: `health` takes no arguments, got {' '.join(argv)}", file=sys.stderr)
        return ExitCode.BAD_CONFIG
    started = time.perf_counter()
    results = run_checks(expect, min_driver, nvml if nvml is not None else open_nvml())
    for result in results:
        print(f"health: {result.line()}", flush=True)
    failed = [result for result in results if result.failed]
    took = time.perf_counter() - started
    if failed:
        print(f"health: node unhealthy after {took:.1f} s", flush=True)
        print(UNHEALTHY_PREFIX + "; ".join(result.line() for result in failed), flush=True)
        return ExitCode.NODE_UNHEALTHY
    print(f"health: node fit for training ({took:.1f} s)", flush=True)
    return ExitCode.DONE
