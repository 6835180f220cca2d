import dataclasses
import re

import pytest

from images.build_args import DOCKERFILE, build_args, torch_cuda_arch_list
from images.matrix import load_matrix

MATRIX = load_matrix()
VARIANTS = MATRIX.variants
DOCKERFILE_TEXT = DOCKERFILE.read_text()


def args_for(variant):
    return build_args(
        MATRIX,
        variant,
        revision="abc123",
        created="2026-01-01T00:00:00Z",
        source_url="https://example.invalid/repo",
    )


def declared_args() -> set[str]:
    return set(re.findall(r"^ARG ([A-Z0-9_]+)", DOCKERFILE_TEXT, flags=re.M))


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.name)
def test_every_dockerfile_arg_gets_a_value_and_every_value_is_declared(variant):
    args = args_for(variant)
    # TORCH_INDEX_URL and CA_BUNDLE depend on how the build is run (builder.py sets them).
    assert declared_args() - set(args) == {"TORCH_INDEX_URL", "CA_BUNDLE", "PYPI_INDEX_URL"}
    assert set(args) <= declared_args()


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.name)
def test_bases_and_pins_come_from_the_matrix(variant):
    args = args_for(variant)
    assert args["BASE_BUILD"] == variant.base_build
    assert args["BASE_RUNTIME"] == variant.base_runtime
    assert args["TORCH_VERSION"] == variant.torch
    assert args["DEEPSPEED_VERSION"] == variant.deepspeed
    assert args["PYTHON_VERSION"] == variant.python
    assert args["IMAGE_VERSION"] == variant.tag(MATRIX.release)
    assert "-cudnn" not in variant.base_runtime, "torch wheels bring cuDNN: use -runtime/-base"
    if variant.cuda:
        assert "devel" in variant.base_build, "the ops build needs nvcc"
        assert args["TRAIN_MIN_DRIVER"] == variant.min_driver
        assert args["NVIDIA_VISIBLE_DEVICES"] == "all"


@pytest.mark.parametrize("variant", [v for v in VARIANTS if v.cuda], ids=lambda v: v.name)
def test_cuda_variants_build_their_ops_for_cuda(variant):
    args = args_for(variant)
    assert args["DEEPSPEED_OPS"].split() == ["FUSED_ADAM", "CPU_ADAM"]
    assert args["DS_ACCELERATOR"] == "cuda"  # a GPU-less builder would otherwise pick cpu


@pytest.mark.parametrize("variant", [v for v in VARIANTS if v.cuda], ids=lambda v: v.name)
def test_arch_list_is_the_wheels_arches_less_what_nvcc_refuses(variant):
    arches = args_for(variant)["TORCH_CUDA_ARCH_LIST"].replace("+PTX", "").split()
    major = int(variant.cuda.split(".")[0])
    # nvcc 13 refuses compute_70 (CUDA 13.0 release notes): written here, not read from the matrix.
    expected = [cc for cc in variant.compute_capabilities if not (major >= 13 and cc == "7.0")]
    assert arches == expected
    assert args_for(variant)["TORCH_CUDA_ARCH_LIST"].endswith("+PTX")


def test_cuda_13_drops_volta_even_when_the_matrix_lists_it():
    cuda13 = next(v for v in VARIANTS if v.cuda)
    variant = dataclasses.replace(cuda13, cuda="13.0", compute_capabilities=("7.0", "7.5", "9.0"))
    args = build_args(MATRIX, variant, revision="r", created="c", source_url="s")
    assert args["TORCH_CUDA_ARCH_LIST"] == "7.5 9.0+PTX"
    cuda12 = dataclasses.replace(variant, cuda="12.8")
    args = build_args(MATRIX, cuda12, revision="r", created="c", source_url="s")
    assert args["TORCH_CUDA_ARCH_LIST"] == "7.0 7.5 9.0+PTX"
    assert torch_cuda_arch_list(cuda12, ("7.5",)) == "7.0 9.0+PTX"


def test_nccl_tests_are_built_for_the_ops_arches_with_ptx_for_the_newest():
    cu130 = MATRIX.variant("cu130")
    gencode = args_for(cu130)["NCCL_TESTS_GENCODE"].split()
    sass = [g for g in gencode if ",code=sm_" in g]
    assert [g.split("code=sm_")[1] for g in sass] == ["75", "80", "86", "90", "100", "120"]
    assert gencode[-1] == "-gencode=arch=compute_120,code=compute_120"  # PTX: newer GPUs JIT
    assert "sm_70" in args_for(MATRIX.variant("cu128"))["NCCL_TESTS_GENCODE"]  # nvcc 12: Volta
    assert args_for(MATRIX.variant("cpu"))["NCCL_TESTS_GENCODE"] == ""


def test_cpu_variant_builds_the_cpu_ops_and_asks_for_no_gpu():
    args = args_for(MATRIX.variant("cpu"))
    # cpu_adam too: the host-side op the CUDA images also carry, so its ISA is tested here.
    assert args["DEEPSPEED_OPS"] == "SHM_COMM CPU_ADAM"
    assert args["EFA_INSTALLER_VERSION"] == args["AWS_OFI_NCCL_VERSION"] == ""
    assert args["NCCL_TESTS_VERSION"] == ""
    assert args["DS_ACCELERATOR"] == "cpu"
    assert args["TORCH_CUDA_ARCH_LIST"] == ""
    assert args["NVIDIA_REQUIRE_CUDA"] == ""
    assert args["NVIDIA_VISIBLE_DEVICES"] == "void"


def test_runtime_stage_carries_labels_for_every_pin():
    runtime = DOCKERFILE_TEXT.split("AS runtime", 1)[1]
    for key in ("title", "version", "revision", "created", "source", "licenses"):
        assert f"org.opencontainers.image.{key}=" in runtime
    for pin in ("torch", "deepspeed", "cuda", "cudnn", "nccl", "python", "min-driver"):
        assert f"org.gpu-training-stack.{pin}=" in runtime


@pytest.mark.parametrize("variant", [v for v in VARIANTS if v.cuda], ids=lambda v: v.name)
def test_cuda_variants_carry_efa_at_the_matrix_pins(variant):
    args = args_for(variant)
    assert args["EFA_INSTALLER_VERSION"] == MATRIX.efa.installer
    assert args["NCCL_NET_PLUGIN"] == "ofi"  # NCCL then loads libnccl-net-ofi.so
    # What the build verifies the downloads by: AWS's EFA key, each release tag's commit.
    assert args["EFA_INSTALLER_GPG_FINGERPRINT"] == "4E9091BCBB97A96B26B15E59A05480B1DD2D3CCC"
    assert args["OFI_NCCL_PREFIX"] == "/opt/amazon/ofi-nccl"
    assert args["NCCL_TESTS_PREFIX"] == "/opt/nccl-tests"
    # nccl-tests v2.19.6's tag commit (github.com/NVIDIA/nccl-tests).
    assert args["NCCL_TESTS_VERSION"] == "2.19.6"
    assert args["NCCL_TESTS_COMMIT"] == "a0b82b2260cf5152b9f8c061bbf7eaf0ba096432"


# Each variant's NCCL series against the aws-ofi-nccl release notes (RELEASENOTES.md at each
# tag): 1.19.x tested 2.27/2.28/2.29, 1.20.0 tested 2.28/2.29/2.30 (not 2.27), 1.21.x 2.31
# only. The newest release that names the series, with its tag's commit.
PLUGIN_FOR_NCCL = {
    "2.27": ("1.19.2", "17120adbfd9721f4d0861360b09f05a8d9c5fba4"),
    "2.29": ("1.20.0", "a2a6d08ea98296f99596b5c18b30b8a20d74f609"),
}


@pytest.mark.parametrize("variant", [v for v in VARIANTS if v.cuda], ids=lambda v: v.name)
def test_each_variant_carries_the_newest_plugin_tested_with_its_nccl(variant):
    args = args_for(variant)
    series = ".".join(variant.nccl.split(".")[:2])
    assert (args["AWS_OFI_NCCL_VERSION"], args["AWS_OFI_NCCL_COMMIT"]) == PLUGIN_FOR_NCCL[series]


def test_the_cuda_13_variant_carries_plugin_1_20_or_later():
    version = args_for(MATRIX.variant("cu130"))["AWS_OFI_NCCL_VERSION"]
    assert tuple(map(int, version.split("."))) >= (1, 20)


def test_cpu_variant_downloads_nothing_and_every_variant_pins_the_cpu_isa():
    args = args_for(MATRIX.variant("cpu"))
    for key in ("EFA_INSTALLER_VERSION", "AWS_OFI_NCCL_VERSION", "AWS_OFI_NCCL_COMMIT"):
        assert args[key] == ""
    for variant in VARIANTS:
        args = args_for(variant)
        assert (args["CPU_OPS_MARCH"], args["CPU_OPS_SIMD"]) == ("x86-64-v3", "__AVX256__")


def test_created_is_the_commit_time_in_utc(monkeypatch):
    from images import build_args as module

    monkeypatch.setattr(module, "_git", lambda *args: "1767225600")  # git log --format=%ct
    assert module.commit_time() == "2026-01-01T00:00:00Z"
    monkeypatch.setattr(module, "_git", lambda *args: "")  # outside a checkout: now
    assert module.commit_time().endswith("Z")
