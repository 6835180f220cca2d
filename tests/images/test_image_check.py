import pytest

from images.image_check import cudnn_version, mismatches

FOUND = {
    "torch": "2.13.0",
    "deepspeed": "0.19.8",
    "cuda": "12.6",
    "cudnn": "9.10.2",
    "nccl": "2.29.3",
}
OPS = {"fused_adam": True, "cpu_adam": True, "fused_lamb": False}


@pytest.mark.parametrize(
    ("code", "version"), [(91002, "9.10.2"), (90100, "9.1.0"), (8902, "8.9.2")]
)
def test_cudnn_version_decodes_both_encodings(code, version):
    assert cudnn_version(code) == version


def test_matching_image_has_no_mismatch():
    expected = {
        "torch": "2.13.0",
        "deepspeed": "0.19.8",
        "cuda": "12.6",
        "cudnn": "9.10.2.21",
        "nccl": "2.29.3",
    }
    assert mismatches(expected, FOUND, OPS, ["fused_adam", "cpu_adam"]) == []


def test_every_mismatch_is_named():
    expected = {
        "torch": "2.13.1",
        "deepspeed": "0.19.8",
        "cuda": "13.0",
        "cudnn": "9.20.0.48",
        "nccl": None,
    }
    problems = mismatches(expected, FOUND, OPS, ["fused_adam", "fused_lamb"])
    assert problems == [
        "torch: the image has 2.13.0, the matrix says 2.13.1",
        "cuda: the image has 12.6, the matrix says 13.0",
        "cudnn: the image has 9.10.2, the matrix says 9.20.0.48",
        "DeepSpeed op 'fused_lamb' is not pre-built",
    ]


def test_cpu_image_without_cuda_fails_a_cuda_expectation():
    found = {**FOUND, "cuda": "", "cudnn": "", "nccl": ""}
    problems = mismatches({"cuda": "12.6"}, found, OPS, [])
    assert problems == ["cuda: the image has none, the matrix says 12.6"]


def test_cpu_expectation_fails_a_cuda_build_of_torch():
    assert mismatches({"cuda": "none"}, {**FOUND, "cuda": ""}, OPS, []) == []
    assert mismatches({"cuda": "none"}, FOUND, OPS, []) == [
        "cuda: the image has 12.6, the matrix says none"
    ]
