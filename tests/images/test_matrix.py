"""images/matrix.toml loads; each bad matrix fails in one line naming variant and field."""

from pathlib import Path

import pytest

from images.matrix import MATRIX_PATH, MatrixError, load_matrix

MATRIX_TEXT = MATRIX_PATH.read_text()


def write_modified(tmp_path: Path, old: str, new: str) -> Path:
    """A copy of the real matrix with the first `old` replaced by `new`."""
    assert old in MATRIX_TEXT, f"test fixture out of date: {old!r} not in matrix.toml"
    path = tmp_path / "matrix.toml"
    path.write_text(MATRIX_TEXT.replace(old, new, 1))
    return path


def load_error(path: Path) -> str:
    with pytest.raises(MatrixError) as caught:
        load_matrix(path)
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_real_matrix_loads_with_the_required_variants():
    matrix = load_matrix()
    assert matrix.names == ("cpu", "cu128", "cu130")  # oldest CUDA first
    cpu, cu128, cu130 = matrix.variants
    assert cpu.cuda is None and cpu.torch == "2.13.0" and cpu.min_driver is None
    assert cpu.base_runtime == cpu.base_build == "debian:bookworm-slim"
    assert "7.0" in cu128.compute_capabilities  # V100 (p3) runs cu128
    assert "7.0" not in cu130.compute_capabilities and cu130.cuda == "13.0"
    assert cu128.torch == "2.10.0" and cu128.torch_index.endswith("/cu128")
    for variant in (cu128, cu130):
        assert "-cudnn" not in variant.base_runtime
        assert variant.base_runtime.split("-")[1] in ("base", "runtime")
        assert "-devel-" in variant.base_build
        assert variant.deepspeed == "0.19.8"
        assert set(variant.sources) >= {"cudnn", "nccl", "min_driver", "compute_capabilities"}


def test_tag_and_lookup():
    matrix = load_matrix()
    assert matrix.variant("cu128").tag("1.2.0") == "1.2.0-torch2.10.0-cu128-py3.12"
    with pytest.raises(MatrixError, match=r"unknown image variant 'cu999'.*cu128"):
        matrix.variant("cu999")


@pytest.mark.parametrize(
    ("capability", "runs"),
    [("8.9", True), ("8.6", True), ("8.0", True), ("9.0", True), ("7.0", False), ("10.3", True)],
)
def test_cu130_arch_compatibility_is_same_major_lower_minor(capability, runs):
    # cu130 carries 7.5 8.0 8.6 9.0 10.0 12.0: sm_89 runs the 8.6 cubins, sm_70 has none.
    assert load_matrix().variant("cu130").runs_on(capability) is runs


def test_a_newer_major_does_not_run_older_major_cubins():
    # cu128 carries 10.0 and 12.0 but no 11.x: a 11.0 GPU cannot run sm_10x cubins.
    assert load_matrix().variant("cu128").runs_on("11.0") is False
    assert load_matrix().variant("cu128").runs_on("10.3") is True


BAD_MATRICES = [
    pytest.param(
        'cudnn = "9.10.2.21"\nnccl = "2.27.5"',
        'cudnm = "9.10.2.21"\nnccl = "2.27.5"',
        ["variant 'cu128'", "field 'cudnm'", "unknown key"],
        id="misspelt-key",
    ),
    pytest.param(
        'torch_index = "https://download.pytorch.org/whl/cu130"',
        'torch_indx = "https://download.pytorch.org/whl/cu130"',
        ["variant 'cu130'", "field 'torch_indx'", "unknown key"],
        id="misspelt-required-key",
    ),
    pytest.param(
        'cudnn = "9.20.0.48"',
        'cudnn = "9.19.0.56"',
        ["variant 'cu130'", "field 'cudnn'", "9.19.0.56", "9.20.0.48"],
        id="cudnn-mismatch",
    ),
    pytest.param(
        'nccl = "2.27.5"',
        'nccl = "2.28.9"',
        ["variant 'cu128'", "field 'nccl'", "2.28.9", "2.27.5"],
        id="nccl-mismatch",
    ),
    pytest.param(
        'compute_capabilities = ["7.5", "8.0", "8.6", "9.0", "10.0", "12.0"]',
        'compute_capabilities = ["7.0", "7.5", "8.0", "8.6", "9.0", "10.0", "12.0"]',
        ["variant 'cu130'", "field 'compute_capabilities'", "7.0", "oldest arch is 7.5"],
        id="cuda13-claims-volta",
    ),
    pytest.param(
        'name = "cu130"',
        'name = "cu128"',
        ["variant 'cu128'", "field 'name'", "duplicate"],
        id="duplicate-name",
    ),
    pytest.param(
        'base_runtime = "nvidia/cuda:12.8.1-base-ubuntu24.04@',
        'base_runtime = "nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04@',
        ["variant 'cu128'", "field 'base_runtime'", "-cudnn-", "-base"],
        id="cudnn-runtime-base",
    ),
    pytest.param(
        'base_build = "nvidia/cuda:12.8.1-devel-ubuntu24.04@',
        'base_build = "nvidia/cuda:12.6.3-devel-ubuntu24.04@',
        ["variant 'cu128'", "field 'base_build'", "CUDA 12.6"],
        id="base-image-cuda-mismatch",
    ),
    pytest.param(
        'torch_index = "https://download.pytorch.org/whl/cu128"',
        'torch_index = "https://download.pytorch.org/whl/cu126"',
        ["variant 'cu128'", "field 'torch_index'", "/cu128"],
        id="index-for-another-cuda",
    ),
    pytest.param(
        'torch = "2.10.0"',
        'torch = "2.11.0"',
        ["variant 'cu128'", "field 'torch'", "2.11.0"],
        id="torch-release-without-facts",
    ),
    pytest.param(
        'min_driver = "570.26"',
        'min_driver = "five-seventy"',
        ["variant 'cu128'", "field 'min_driver'", "five-seventy"],
        id="driver-not-a-version",
    ),
    pytest.param(
        'python = "3.12"',
        'python = "3.11"',
        ["variant 'cu128'", "field 'python'", "3.11", "ubuntu24.04", "3.12"],
        id="python-not-the-base-os-system-python",
    ),
    pytest.param(
        'base_runtime = "nvidia/cuda:12.8.1-base-ubuntu24.04@',
        'base_runtime = "nvidia/cuda:12.8.1-base-ubuntu22.04@',
        ["variant 'cu128'", "field 'base_runtime'", "ubuntu22.04", "one OS"],
        id="build-and-runtime-on-different-os",
    ),
    pytest.param(
        'python = "3.11"',
        "python = 3.11",
        ["variant 'cpu'", "field 'python'", "3.11"],
        id="version-as-number",
    ),
]


@pytest.mark.parametrize(("old", "new", "expected"), BAD_MATRICES)
def test_bad_matrix_is_rejected_naming_variant_and_field(tmp_path, old, new, expected):
    message = load_error(write_modified(tmp_path, old, new))
    for part in expected:
        assert part in message


def test_missing_source_is_rejected(tmp_path):
    old = 'nccl = "PyPI torch-2.10.0 metadata (cu128 build): nvidia-nccl-cu12==2.27.5"\n'
    message = load_error(write_modified(tmp_path, old, ""))
    assert "variant 'cu128'" in message and "field 'sources'" in message and "nccl" in message


def test_gpu_field_on_cpu_variant_is_rejected(tmp_path):
    old = 'torch_index = "https://download.pytorch.org/whl/cpu"'
    message = load_error(write_modified(tmp_path, old, old + '\nnccl = "2.29.7"'))
    assert "variant 'cpu'" in message and "field 'nccl'" in message


def test_unknown_top_level_key_and_bad_toml(tmp_path):
    path = write_modified(tmp_path, 'release = "0.1.0"', 'release = "0.1.0"\nrelaese = "x"')
    assert "unknown key 'relaese'" in load_error(path)
    path = write_modified(tmp_path, 'release = "0.1.0"', 'release = "0.1.0')
    assert "not valid TOML" in load_error(path)


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        (
            '[base_os."ubuntu24.04"]\npython = "3.12"',
            '[base_os."ubuntu24.04"]\npython = "3.13"',
            ["variant 'cu128'", "field 'python'", "3.12", "ubuntu24.04's system Python (3.13)"],
        ),
        ('glibc = "2.36"', 'glibc = "two"', ["base_os 'bookworm'", "glibc", "two"]),
        (
            'oldest_arch = "7.5"',
            'oldest_arch = "8.0"',
            ["variant 'cu130'", "compute_capabilities", "7.5", "oldest arch is 8.0"],
        ),
        (
            "[deepspeed_ops.cpu]",
            "[deepspeed_ops.cpuu]",
            ["variant 'cpu'", "no [deepspeed_ops.cpu] table"],
        ),
        (
            '[aws_ofi_nccl."1.19.2"]',
            '[aws_ofi_nccl."latest"]',
            ["aws_ofi_nccl 'latest'", "version", "latest"],
        ),
        (
            'commit = "17120adbfd9721f4d0861360b09f05a8d9c5fba4"',
            'commit = "17120adb"',
            ["aws_ofi_nccl '1.19.2'", "commit", "40 lower-case hex digits"],
        ),
        (
            'tested_nccl = ["2.27", "2.28", "2.29"]',
            'tested_nccl = ["2.28", "2.29"]',
            ["variant 'cu128'", "'nccl'", "no aws-ofi-nccl release", "tested with NCCL 2.27.5"],
        ),
        ("[nccl_tests]", "[nccl_testss]", ["nccl_tests"]),
        (
            'installer_gpg_fingerprint = "4E9091BCBB97A96B26B15E59A05480B1DD2D3CCC"',
            'installer_gpg_fingerprint = "4E90 91BC"',
            ["[efa]", "installer_gpg_fingerprint", "40 upper-case hex digits"],
        ),
        ("[cpu_isa]", "[cpu_isaa]", ["cpu_isa"]),
    ],
)
def test_toolchain_facts_are_data_checked_like_variants(tmp_path, old, new, expected):
    message = load_error(write_modified(tmp_path, old, new))
    for part in expected:
        assert part in message


def test_toolchain_facts_load_with_their_sources():
    matrix = load_matrix()
    assert matrix.os_of(matrix.variant("cpu")).python == "3.11"
    assert matrix.cuda_major(matrix.variant("cu130")).nvcc_refuses == ("7.0",)
    assert matrix.cuda_major(matrix.variant("cu128")) is None  # CUDA 12 refuses none of its arches
    assert matrix.ops(matrix.variant("cpu")) == {
        "SHM_COMM": "deepspeed_shm_comm",
        "CPU_ADAM": "cpu_adam",
    }
    assert (matrix.cpu_isa.march, matrix.cpu_isa.simd) == ("x86-64-v3", "__AVX256__")
    facts = [*matrix.base_os.values(), *matrix.net_plugins, matrix.efa, matrix.cpu_isa]
    assert all(t.source for t in [*facts, matrix.nccl_tests])


def test_missing_file(tmp_path):
    assert "file not found" in load_error(tmp_path / "absent.toml")


def test_pins_agree_with_requirements_train():
    # The trainer outside an image runs the cpu variant's stack: one set of pins.
    repo = MATRIX_PATH.parents[1]
    pins = dict(
        line.split("==", 1)
        for line in (repo / "requirements-train.txt").read_text().splitlines()
        if "==" in line and not line.startswith("#")
    )
    matrix = load_matrix()
    assert matrix.variant("cpu").torch == pins["torch"]
    assert {v.deepspeed for v in matrix.variants} == {pins["deepspeed"]}


CU130_RUNTIME = (
    "nvidia/cuda:13.0.3-base-ubuntu24.04"
    "@sha256:7c7413a56200486f71f181cad9310f6fd31b6bb21816ade15fc9c1e1e927a5c1"
)


def test_a_cuda_base_must_be_pinned_by_a_whole_digest(tmp_path):
    tag_only = write_modified(
        tmp_path,
        f'base_runtime = "{CU130_RUNTIME}"',
        'base_runtime = "nvidia/cuda:13.0.3-base-ubuntu24.04"',
    )
    message = load_error(tag_only)
    assert "variant 'cu130'" in message and "field 'base_runtime'" in message
    assert "a tag without a digest" in message and "@sha256:<digest>" in message
    short = write_modified(
        tmp_path,
        f'base_runtime = "{CU130_RUNTIME}"',
        'base_runtime = "nvidia/cuda:13.0.3-base-ubuntu24.04@sha256:abc"',
    )
    assert "is not an nvidia/cuda -base/-runtime image" in load_error(short)
