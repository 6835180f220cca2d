"""What this machine's NVIDIA driver and GPU report, read through NVML.

Both answer None without an NVIDIA GPU or driver: a CPU run. training/spec/selfcheck.py
checks the answers against the image and the job.
"""

from __future__ import annotations


def installed_driver() -> str | None:
    """The driver version NVML reports, or None when there is no NVIDIA GPU or driver."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            if pynvml.nvmlDeviceGetCount() == 0:
                return None
            return pynvml.nvmlSystemGetDriverVersion()
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return None


def gpu_capability() -> tuple[int, int] | None:
    """Compute capability of GPU 0 from NVML (no CUDA context), or None without a GPU."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            return tuple(pynvml.nvmlDeviceGetCudaComputeCapability(handle))
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return None
