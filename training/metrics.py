"""Throughput, MFU, GPU state, and where they are written (JSONL, TensorBoard, tqdm)."""

from __future__ import annotations

import json
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PEAKS_FILE = Path(__file__).with_name("gpu_peaks.toml")


@dataclass(frozen=True)
class GpuPeak:
    match: str
    source: str
    bf16: float | None = None
    fp16: float | None = None


def load_peaks(path: Path = PEAKS_FILE) -> list[GpuPeak]:
    return [GpuPeak(**entry) for entry in tomllib.loads(path.read_text())["gpu"]]


def peak_tflops(gpu_name: str | None, *, bf16: bool, peaks: list[GpuPeak] | None = None):
    """The dense 16-bit tensor peak for an NVML GPU name, or None when unknown (or CPU).

    bf16 runs use the bf16 peak; fp16 and fp32 runs use the fp16 one (the 16-bit peak is
    the reference an fp32 run falls short of). GPUs without bf16 fall back to fp16.
    """
    if not gpu_name:
        return None
    for peak in peaks if peaks is not None else load_peaks():
        if peak.match in gpu_name:
            return (peak.bf16 if bf16 else None) or peak.fp16
    return None


def mfu(flops_per_token: float, tokens_per_s_per_gpu: float, peak: float | None):
    """Model FLOPs utilisation: achieved model FLOPs over the GPU's peak (TFLOPS)."""
    if not peak:
        return None
    return flops_per_token * tokens_per_s_per_gpu / (peak * 1e12)


def run_cost(seconds: float, gpus: int, price: float | None) -> str:
    """GPU-hours of a run, and what they cost at `price` USD per hour when it is known (the
    cost per billion tokens is the goodput report's, over the run's whole wall time)."""
    gpu_hours = gpus * seconds / 3600
    text = f"{gpu_hours:,.2f} GPU-hours"
    if price is not None:
        text += f", ${price * seconds / 3600:,.2f} at ${price:,.2f}/h"
    return text


class GpuMonitor:
    """Utilisation and memory of this rank's GPU via NVML; empty readings without GPUs."""

    def __init__(self, local_rank: int):
        self._handle = None
        self.name: str | None = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(local_rank)
            self.name = pynvml.nvmlDeviceGetName(self._handle)
            self._nvml = pynvml
        except Exception:
            # No driver or no GPU (CPU runs, tests): the other metrics still work.
            self._handle = None

    def read(self) -> dict[str, float]:
        if self._handle is None:
            return {}
        util = self._nvml.nvmlDeviceGetUtilizationRates(self._handle)
        memory = self._nvml.nvmlDeviceGetMemoryInfo(self._handle)
        return {
            "gpu_util_pct": float(util.gpu),
            "gpu_mem_used_gib": memory.used / 2**30,
            "gpu_mem_total_gib": memory.total / 2**30,
        }


class MetricsSink:
    """Rank 0's outputs: <output_dir>/metrics.jsonl, TensorBoard and a progress bar."""

    def __init__(
        self,
        output_dir: Path,
        *,
        total_steps: int,
        start_step: int,
        tensorboard: bool,
        progress_bar: bool,
    ):
        output_dir.mkdir(parents=True, exist_ok=True)
        self._jsonl = open(output_dir / "metrics.jsonl", "a", buffering=1)  # noqa: SIM115
        self._tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(output_dir / "tensorboard"))
        self._bar = None
        if progress_bar:
            from tqdm import tqdm

            interactive = sys.stderr.isatty()
            self._bar = tqdm(
                total=total_steps,
                initial=start_step,
                desc="train",
                unit="step",
                mininterval=0.5 if interactive else 30,
                dynamic_ncols=interactive,
            )

    def write(self, record: dict[str, Any]) -> None:
        self._jsonl.write(json.dumps(record) + "\n")
        step = record["step"]
        if self._tb is not None:
            for key, value in record.items():
                if key != "step" and isinstance(value, int | float):
                    self._tb.add_scalar(f"train/{key}", value, step)
        if self._bar is not None:
            self._bar.set_postfix(loss=f"{record['loss']:.4f}", refresh=False)

    def advance(self, steps: int = 1) -> None:
        if self._bar is not None:
            self._bar.update(steps)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        if self._tb is not None:
            self._tb.close()
        self._jsonl.close()
