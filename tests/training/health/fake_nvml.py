"""NVML's answers for a node we do not have: pynvml's own constants and errors, fake GPUs."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import pynvml


@dataclass
class FakeGpu:
    name: str = "NVIDIA A100-SXM4-40GB"
    uncorrected_ecc: int = 0
    retirement_pending: bool = False
    remapped_rows: tuple[int, int, bool, bool] | None = (0, 0, False, False)  # None: pre-Ampere


@dataclass
class FakeNvml:
    """The subset of pynvml the gate calls, answering from `gpus`."""

    gpus: list[FakeGpu] = field(default_factory=lambda: [FakeGpu() for _ in range(8)])
    driver: str = "570.172.08"
    xids: list[int] = field(default_factory=list)  # XID events raised during the gate
    registered: int = 0

    def __getattr__(self, name: str):  # constants and error classes: the real module's
        return getattr(pynvml, name)

    def nvmlSystemGetDriverVersion(self) -> str:
        return self.driver

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        return self.gpus[index]

    def nvmlDeviceGetName(self, gpu: FakeGpu) -> str:
        return gpu.name

    def nvmlDeviceGetTotalEccErrors(self, gpu: FakeGpu, error_type: int, counter: int) -> int:
        assert (error_type, counter) == (
            pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            pynvml.NVML_VOLATILE_ECC,
        )
        return gpu.uncorrected_ecc

    def nvmlDeviceGetRetiredPagesPendingStatus(self, gpu: FakeGpu) -> int:
        return pynvml.NVML_FEATURE_ENABLED if gpu.retirement_pending else 0

    def nvmlDeviceGetRemappedRows(self, gpu: FakeGpu):
        if gpu.remapped_rows is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu.remapped_rows

    def nvmlEventSetCreate(self) -> list[int]:
        return list(self.xids)

    def nvmlDeviceRegisterEvents(self, gpu: FakeGpu, events: int, event_set) -> None:
        assert events == pynvml.nvmlEventTypeXidCriticalError
        self.registered += 1

    def nvmlEventSetWait_v2(self, event_set: list[int], timeout_ms: int):
        if not event_set:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
        return SimpleNamespace(eventData=event_set.pop(0))

    def nvmlEventSetFree(self, event_set) -> None:
        pass
