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


# Where nccl-tests' all_reduce_perf lives in the CUDA images (image_check.py and
# gpu_check.py run it from there).
NCCL_TESTS_PREFIX = "/opt/nccl-tests"


def _nvcc_arches(variant: Variant, nvcc_refuses: tuple[str, ...]) -> list[str]:
    """The wheels' arches that the variant's nvcc can still target."""
    if variant.cuda is None:
        return []
    return [cc for cc in variant.compute_capabilities if cc not in nvcc_refuses]


def torch_cuda_arch_list(variant: Variant, nvcc_refuses: tuple[str, ...] = ()) -> str:
    """TORCH_CUDA_ARCH_LIST for the ops build: the wheels' arches nvcc can still target.

    The last arch also gets PTX so that newer GPUs can JIT the ops instead of failing.
    """
    arches = _nvcc_arches(variant, nvcc_refuses)
    if not arches:
        return ""
    return " ".join([*arches[:-1], f"{arches[-1]}+PTX"])


def nvcc_gencode(variant: Variant, nvcc_refuses: tuple[str, ...] = ()) -> str:
    """NVCC_GENCODE for nccl-tests (its src/common.mk): the same arches as the ops, each as
    SASS, and the last as PTX too."""
    arches = [cc.replace(".", "") for cc in _nvcc_arches(variant, nvcc_refuses)]
    if not arches:
        return ""
    flags = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in arches]
    return " ".join([*flags, f"-gencode=arch=compute_{arches[-1]},code=compute_{arches[-1]}"])


def nvidia_require_cuda(variant: Variant) -> str:
    """The NVIDIA container toolkit refuses to start the image on a host that fails this.

    One clause, its parts joined by commas: in libnvidia-container's grammar a comma is
    AND and a space is OR (src/cli/dsl.c, dsl_evaluate). The bound is the driver below
    which nothing of the image can run: CUDA minor-version compatibility's floor
    (`compat_driver_floor`). Between it and `min_driver` the container starts and the
    trainer refuses with a message naming both versions (TRAIN_MIN_DRIVER); without the
    base's forward-compatibility clauses (brand=tesla,driver>=535,...) because the image
    ships no start step that puts the CUDA compat libraries in front of the host's driver.
    """
    if variant.cuda is None:
        return ""
    major = variant.cuda.split(".")[0]
    return f"cuda>={major}.0,driver>={variant.compat_driver_floor}"


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
        "NCCL_TESTS_GENCODE": nvcc_gencode(variant, toolkit.nvcc_refuses if toolkit else ()),
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
    """The EFA installer, the variant's aws-ofi-nccl release and nccl-tests, with what
    verifies each; empty for cpu."""
    plugin = matrix.net_plugin(variant)
    pins = {}
    if plugin is not None:
        pins = {
            "EFA_INSTALLER_VERSION": matrix.efa.installer,
            "EFA_INSTALLER_GPG_FINGERPRINT": matrix.efa.installer_gpg_fingerprint,
            "AWS_OFI_NCCL_VERSION": plugin.version,
            "AWS_OFI_NCCL_COMMIT": plugin.commit,
            "NCCL_TESTS_VERSION": matrix.nccl_tests.version,
            "NCCL_TESTS_COMMIT": matrix.nccl_tests.commit,
        }
    names = (
        "EFA_INSTALLER_VERSION",
        "EFA_INSTALLER_GPG_FINGERPRINT",
        "AWS_OFI_NCCL_VERSION",
        "AWS_OFI_NCCL_COMMIT",
        "NCCL_TESTS_VERSION",
        "NCCL_TESTS_COMMIT",
    )
    # The folders exist in every image (the runtime stage copies them), empty for cpu.
    return {
        **{name: pins.get(name, "") for name in names},
        "OFI_NCCL_PREFIX": OFI_NCCL_PREFIX,
        "NCCL_TESTS_PREFIX": NCCL_TESTS_PREFIX,
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
