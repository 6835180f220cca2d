"""What the benchmarks ran on: CPU model and cores, memory, GPU and driver, versions."""

from __future__ import annotations

import os
import platform
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import psutil

from training.machine import installed_driver


def describe() -> dict:
    return {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "cores_usable": len(os.sched_getaffinity(0)),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "gpu": _gpu_name(),
        "driver": installed_driver(),
        "os": platform.platform(),
        "python": sys.version.split()[0],
        **{name: _version(name) for name in ("torch", "deepspeed", "pulumi", "pulumi-aws")},
    }


def one_line(machine: dict) -> str:
    gpu = f"{machine['gpu']} (driver {machine['driver']})" if machine["gpu"] else "no GPU"
    return (
        f"{machine['cpu']}, {machine['cores_usable']} of {machine['cores']} cores, "
        f"{machine['memory_gib']} GiB, {gpu}; Python {machine['python']}, "
        f"torch {machine['torch']}, DeepSpeed {machine['deepspeed']}"
    )


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _gpu_name() -> str | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0))
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return None


def _version(distribution: str) -> str | None:
    try:
        return version(distribution)
    except PackageNotFoundError:
        return None
