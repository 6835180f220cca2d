"""Start-up checks of the machine against the job, before any worker starts.

- The NVIDIA driver: the image sets TRAIN_MIN_DRIVER to its CUDA toolkit's minimum
  driver (images/matrix.toml); a too-old driver otherwise shows up later as an obscure
  CUDA error.
- The precision: bf16 needs compute capability 8.0 (Ampere) or newer; fp16 needs a GPU
  (DeepSpeed's CPU backend has no fp16). Otherwise a worker fails after minutes of setup.

Pure functions of what the machine reports (training/machine.py reads it), so the
Pulumi program runs the same precision check against the stack's GPU at preview.
"""

from __future__ import annotations

from common.versions import version_key


class SelfCheckError(Exception):
    """The machine cannot run this image; str(error) is the one-line reason."""


def _version(text: str) -> tuple[int, ...]:
    try:
        return version_key(text.strip())
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
    if _version(driver) < _version(min_driver):
        raise SelfCheckError(
            f"NVIDIA driver {driver} is older than {min_driver}, the minimum this image needs "
            "(TRAIN_MIN_DRIVER): use a host/AMI with driver >= "
            f"{min_driver}, or an image variant built for an older CUDA"
        )


def check_precision(*, bf16: bool, fp16: bool, on_gpu: bool, capability: tuple[int, int] | None):
    """Raise SelfCheckError when this machine cannot train in the requested precision."""
    if fp16 and not on_gpu:
        raise SelfCheckError(
            "precision.fp16 = true needs a GPU (DeepSpeed has no fp16 on CPU): "
            "use precision.bf16 = true or fp32 on this machine"
        )
    if bf16 and capability is not None and capability < (8, 0):
        raise SelfCheckError(
            f"precision.bf16 = true needs compute capability 8.0 or newer (A100, H100, L4, A10G);"
            f" this GPU has {capability[0]}.{capability[1]}: use precision.fp16 = true"
        )
