"""Start-up check: refuse to train on an NVIDIA driver older than the image needs.

The image sets TRAIN_MIN_DRIVER to its CUDA toolkit's minimum driver (images/matrix.toml).
A too-old driver otherwise shows up much later as an obscure CUDA error.
"""

from __future__ import annotations


class SelfCheckError(Exception):
    """The machine cannot run this image; str(error) is the one-line reason."""


def parse_version(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.strip().split("."))
    except ValueError:
        raise SelfCheckError(
            f"driver version {text!r} is not dotted numbers (e.g. 560.28.03)"
        ) from None


def check_driver(min_driver: str | None, driver: str | None) -> None:
    """Raise SelfCheckError when `driver` is older than `min_driver`.

    Nothing to check without a minimum (TRAIN_MIN_DRIVER unset) or without a driver
    (no GPU: a CPU run).
    """
    if not min_driver or driver is None:
        return
    if parse_version(driver) < parse_version(min_driver):
        raise SelfCheckError(
            f"NVIDIA driver {driver} is older than {min_driver}, the minimum this image needs "
            "(TRAIN_MIN_DRIVER): use a host/AMI with driver >= "
            f"{min_driver}, or an image variant built for an older CUDA"
        )


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
