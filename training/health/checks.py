"""The health gate's checks: each measures one thing about this node and says how it compares.

Every check returns a Check: its name, whether it passed, the figure it measured and the
threshold it held it to, so the gate prints one line per check and a failure names both.
The GPU checks read NVML through nvidia-ml-py (`pynvml`), passed in as `nvml` so that tests
can answer in its place; without a GPU they are skipped, never failed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from training.health.expectation import NodeExpectation
from training.spec.selfcheck import SelfCheckError, check_driver

NO_GPU = "no GPU"
# The all-reduce must reach this share of the catalog's figure. nccl-tests runs on one
# node vary by a few percent; a degraded NVLink or a GPU fallen back to PCIe costs half or
# more, so 80% separates the two.
BUSBW_TOLERANCE = 0.8
# Where the kernel lists RDMA devices; an EFA device's driver link ends in "efa"
# (EFA kernel module, https://github.com/amzn/amzn-drivers/tree/master/kernel/linux/efa).
INFINIBAND_CLASS = Path("/sys/class/infiniband")
# `dcgmi diag -r 1`: DCGM's quick run level, "a few seconds" (DCGM user guide, "Run
# Levels": 1 quick, 2 medium about 2 minutes, 3 long, 4 extended); -j prints JSON.
DCGM_DIAG = ("diag", "--run", "1", "--json")
DCGM_TIMEOUT_S = 120


@dataclass(frozen=True)
class Check:
    name: str
    status: Literal["ok", "failed", "skipped"]
    figure: str  # what was measured, or why the check was skipped
    threshold: str = ""

    @property
    def failed(self) -> bool:
        return self.status == "failed"

    def line(self) -> str:
        threshold = f" (threshold: {self.threshold})" if self.threshold else ""
        return f"{self.name}: {self.status}: {self.figure}{threshold}"


def skipped(name: str, why: str = NO_GPU) -> Check:
    return Check(name, "skipped", why)


def _result(name: str, ok: bool, figure: str, threshold: str) -> Check:
    return Check(name, "ok" if ok else "failed", figure, threshold)


def driver(min_driver: str | None, nvml: Any | None) -> Check:
    """The loaded driver against the image's minimum (training/spec/selfcheck.py)."""
    name = "driver"
    if nvml is None:
        return skipped(name)
    installed = nvml.nvmlSystemGetDriverVersion()
    try:
        check_driver(min_driver, installed)
    except SelfCheckError as error:
        return Check(name, "failed", str(error), f">= {min_driver}")
    return _result(name, True, installed, f">= {min_driver}" if min_driver else "none set")


def gpus(expect: NodeExpectation, nvml: Any | None) -> Check:
    """As many GPUs as the catalog says, each of the catalog's model."""
    name = "gpus"
    if nvml is None:
        return skipped(name)
    names = [
        nvml.nvmlDeviceGetName(nvml.nvmlDeviceGetHandleByIndex(index))
        for index in range(nvml.nvmlDeviceGetCount())
    ]
    figure = f"{len(names)} x {names[0] if names else 'none'}"
    wrong = [n for n in names if expect.gpu_model and expect.gpu_model not in n]
    count = expect.gpus if expect.gpus is not None else "any number"
    threshold = f"{count} x {expect.gpu_model or 'any model'}"
    if wrong:
        others = ", ".join(sorted(set(wrong)))
        figure = f"{len(names)} GPUs, {len(wrong)} not {expect.gpu_model}: {others}"
    ok = not wrong and (expect.gpus is None or len(names) == expect.gpus)
    return _result(name, ok and bool(names), figure, threshold)


def memory_errors(nvml: Any | None) -> Check:
    """No uncorrected ECC error since the driver loaded, and no page waiting to be retired
    or row waiting to be remapped (both need a GPU reset before the memory is trusted)."""
    name = "memory errors"
    if nvml is None:
        return skipped(name)
    problems = []
    for index in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        uncorrected = _supported(
            nvml,
            lambda h=handle: nvml.nvmlDeviceGetTotalEccErrors(
                h, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC
            ),
        )
        if uncorrected:
            problems.append(f"GPU {index}: {uncorrected} uncorrected ECC errors")
        # Pre-Ampere GPUs retire pages; Ampere and newer remap rows instead (NVML reference,
        # nvmlDeviceGetRetiredPagesPendingStatus and nvmlDeviceGetRemappedRows).
        pending = _supported(nvml, lambda h=handle: nvml.nvmlDeviceGetRetiredPagesPendingStatus(h))
        if pending == nvml.NVML_FEATURE_ENABLED:
            problems.append(f"GPU {index}: page retirement pending")
        rows = _supported(nvml, lambda h=handle: nvml.nvmlDeviceGetRemappedRows(h))
        if rows is not None:
            _, _, remap_pending, remap_failed = rows
            if remap_pending:
                problems.append(f"GPU {index}: row remapping pending")
            if remap_failed:
                problems.append(f"GPU {index}: row remapping failed")
    figure = "; ".join(problems) or "none"
    return _result(name, not problems, figure, "0 uncorrected ECC errors, nothing pending")


def _supported(nvml: Any, query: Callable[[], Any]) -> Any:
    """The query's answer, or None where this GPU does not support it (no ECC on a T4 in
    some modes, no row remapping before Ampere)."""
    try:
        return query()
    except nvml.NVMLError as error:
        if getattr(error, "value", None) == nvml.NVML_ERROR_NOT_SUPPORTED:
            return None
        raise


class XidWatch:
    """XID errors (the driver's GPU fault reports) that arrive while the gate runs.

    NVML delivers XID events only to a listener registered before they happen
    (nvmlDeviceRegisterEvents, nvmlEventTypeXidCriticalError), so the gate opens this first
    and reads it after the all-reduce and DCGM have exercised the GPUs.
    """

    def __init__(self, nvml: Any | None):
        self.nvml = nvml
        self.events = None
        if nvml is None:
            return
        self.events = nvml.nvmlEventSetCreate()
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            _supported(
                nvml,
                lambda h=handle: nvml.nvmlDeviceRegisterEvents(
                    h, nvml.nvmlEventTypeXidCriticalError, self.events
                ),
            )

    def check(self) -> Check:
        name = "xid errors"
        if self.nvml is None:
            return skipped(name)
        xids = []
        while True:
            try:
                event = self.nvml.nvmlEventSetWait_v2(self.events, 0)
            except self.nvml.NVMLError_Timeout:
                break
            xids.append(f"XID {event.eventData}")
        self.nvml.nvmlEventSetFree(self.events)
        return _result(name, not xids, ", ".join(xids) or "none", "no XID during the gate")


def dcgm_diag(nvml: Any | None, dcgmi: str | None = None) -> Check:
    """DCGM's quick diagnostic where DCGM is installed (dcgmi on PATH)."""
    name = "dcgm diag"
    if nvml is None:
        return skipped(name)
    dcgmi = dcgmi or shutil.which("dcgmi")
    if dcgmi is None:
        return skipped(name, "DCGM not installed (no dcgmi on PATH)")
    result = subprocess.run(
        [dcgmi, *DCGM_DIAG], capture_output=True, text=True, timeout=DCGM_TIMEOUT_S
    )
    try:
        report = json.loads(result.stdout)
    except ValueError:
        tail = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["no output"]
        return Check(
            name, "failed", f"dcgmi exited {result.returncode}: {tail[0]}", "run level 1 passes"
        )
    failures = sorted(set(_failed_tests(report)))
    figure = f"failed: {', '.join(failures)}" if failures else "all tests passed"
    return _result(name, not failures, figure, "run level 1 passes")


def _failed_tests(node: Any, test: str = "") -> list[str]:
    """Names of the tests whose result status is Fail, anywhere in dcgmi's JSON report."""
    if isinstance(node, list):
        return [name for item in node for name in _failed_tests(item, test)]
    if not isinstance(node, dict):
        return []
    test = str(node.get("name") or node.get("test_name") or test)
    failed = str(node.get("status", "")).lower() == "fail"
    return [test] * failed + [
        name
        for value in node.values()
        if isinstance(value, list | dict)
        for name in _failed_tests(value, test)
    ]


def allreduce(
    expect: NodeExpectation, measure: Callable[[], float] | None, gpu_count: int
) -> Check:
    """An all-reduce across the node's GPUs: its bus bandwidth against the catalog's."""
    name = "all-reduce"
    if measure is None:
        return skipped(name)
    if gpu_count < 2:
        return skipped(name, "one GPU: nothing to reduce across")
    busbw = measure()
    return bandwidth(name, f"{busbw:.1f} GB/s bus bandwidth", busbw, expect.busbw_gbps)


def bandwidth(name: str, figure: str, busbw: float, expected: float | None) -> Check:
    """A measured bus bandwidth against the catalog's figure, BUSBW_TOLERANCE of it."""
    if expected is None:
        return _result(name, True, figure, "no catalog figure")
    floor = expected * BUSBW_TOLERANCE
    return _result(
        name, busbw >= floor, figure, f">= {floor:.1f} GB/s, {BUSBW_TOLERANCE:.0%} of {expected:g}"
    )


def efa(expect: NodeExpectation, infiniband: Path | None = None) -> Check:
    """The EFA devices the stack attached are all visible (a missing one halves the
    node's network bandwidth, or more)."""
    name = "efa"
    infiniband = infiniband or INFINIBAND_CLASS
    found = sorted(
        device.name
        for device in (infiniband.iterdir() if infiniband.is_dir() else ())
        if os.path.realpath(device / "device" / "driver").endswith("/efa")
    )
    expected = expect.efa_devices or 0
    return _result(name, len(found) >= expected, f"{len(found)} EFA devices", f">= {expected}")


def busbw_gbps(seconds: float, nbytes: int, ranks: int) -> float:
    """nccl-tests' bus bandwidth of an all-reduce: algorithm bandwidth x 2(n-1)/n
    (https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md)."""
    return nbytes / seconds * 2 * (ranks - 1) / ranks / 1e9
