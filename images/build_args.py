"""Dockerfile build arguments for one variant, all derived from images/matrix.toml."""

from __future__ import annotations

import os
import subprocess
from datetime import UTC, datetime
from pathlib import Path

from images.matrix import Matrix, Variant

REPO_ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = REPO_ROOT / "images" / "Dockerfile"

# The image repository every variant is pushed to; the tag carries the variant.
IMAGE_NAME = "gpu-training-stack"

# Where the aws-ofi-nccl plugin is installed (the EFA installer's own location for it), so
# that the image build and the image check (image_check.py --net-plugin-dir) agree.
OFI_NCCL_PREFIX = "/opt/amazon/ofi-nccl"


def torch_cuda_arch_list(variant: Variant, nvcc_refuses: tuple[str, ...] = ()) -> str:
    """TORCH_CUDA_ARCH_LIST for the ops build: the wheels' arches nvcc can still target.

    The last arch also gets PTX so that newer GPUs can JIT the ops instead of failing.
    """
    arches = [cc for cc in variant.compute_capabilities if cc not in nvcc_refuses]
    if variant.cuda is None or not arches:
        return ""
    return " ".join([*arches[:-1], f"{arches[-1]}+PTX"])


def nvidia_require_cuda(variant: Variant) -> str:
    """The NVIDIA container toolkit refuses to start the image on a host that fails this."""
    if variant.cuda is None:
        return ""
    return f"cuda>={variant.cuda} driver>={variant.min_driver}"


def build_args(
    matrix: Matrix, variant: Variant, *, revision: str, created: str, source_url: str
) -> dict[str, str]:
    """Every ARG the Dockerfile declares, for this variant (pins also become image labels)."""
    toolkit = matrix.cuda_major(variant)
    return {
        "VARIANT": variant.name,
        "IMAGE_VERSION": variant.tag(matrix.release),
        "REVISION": revision,
        "CREATED": created,
        "SOURCE_URL": source_url,
        "BASE_BUILD": variant.base_build,
        "BASE_RUNTIME": variant.base_runtime,
        "PYTHON_VERSION": variant.python,
        "TORCH_VERSION": variant.torch,
        "DEEPSPEED_VERSION": variant.deepspeed,
        "CUDA_VERSION": variant.cuda or "",
        "CUDNN_VERSION": variant.cudnn or "",
        "NCCL_VERSION": variant.nccl or "",
        "COMPUTE_CAPABILITIES": ",".join(variant.compute_capabilities),
        "TORCH_CUDA_ARCH_LIST": torch_cuda_arch_list(
            variant, toolkit.nvcc_refuses if toolkit else ()
        ),
        "DS_ACCELERATOR": variant.accelerator,
        "DEEPSPEED_OPS": " ".join(matrix.ops(variant)),
        "CPU_OPS_MARCH": matrix.cpu_isa.march,
        "CPU_OPS_SIMD": matrix.cpu_isa.simd,
        # EFA and its NCCL plugin serve GPUs only: the cpu image carries neither.
        **efa_args(matrix, variant),
        # NCCL then loads libnccl-net-ofi.so, the aws-ofi-nccl plugin (image_check.py).
        "NCCL_NET_PLUGIN": "ofi" if variant.cuda else "",
        "NVIDIA_REQUIRE_CUDA": nvidia_require_cuda(variant),
        # "void" keeps the toolkit from injecting GPUs into an image that cannot use them.
        "NVIDIA_VISIBLE_DEVICES": "all" if variant.cuda else "void",
        "TRAIN_MIN_DRIVER": variant.min_driver or "",
    }


def efa_args(matrix: Matrix, variant: Variant) -> dict[str, str]:
    """The EFA installer and aws-ofi-nccl pins and what verifies them; empty for cpu."""
    efa = matrix.efa
    pins = {
        "EFA_INSTALLER_VERSION": efa.installer,
        "EFA_INSTALLER_GPG_FINGERPRINT": efa.installer_gpg_fingerprint,
        "AWS_OFI_NCCL_VERSION": efa.aws_ofi_nccl,
        "AWS_OFI_NCCL_SHA512": efa.aws_ofi_nccl_sha512,
    }
    # The folder exists in every image (the runtime stage copies it), empty for cpu.
    return {
        **{key: value if variant.cuda else "" for key, value in pins.items()},
        "OFI_NCCL_PREFIX": OFI_NCCL_PREFIX,
    }


def _git(*args: str) -> str:
    result = subprocess.run(
        ["git", "-C", str(REPO_ROOT), *args], capture_output=True, text=True, check=False
    )
    return result.stdout.strip() if result.returncode == 0 else ""


def git_revision() -> str:
    """The commit being built, or "unknown" outside a git checkout."""
    return _git("rev-parse", "HEAD") or "unknown"


def source_url() -> str:
    """Where the source lives: GitHub Actions says so; elsewhere the origin remote does."""
    server, repository = os.environ.get("GITHUB_SERVER_URL"), os.environ.get("GITHUB_REPOSITORY")
    if server and repository:
        return f"{server}/{repository}"
    return _git("remote", "get-url", "origin") or "unknown"


def commit_time() -> str:
    """The commit's time in UTC (org.opencontainers.image.created): two builds of one commit
    get one label, so the label never makes a rebuild differ. Now, outside a git checkout."""
    epoch = _git("log", "-1", "--format=%ct")
    moment = datetime.fromtimestamp(int(epoch), UTC) if epoch else datetime.now(UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")
