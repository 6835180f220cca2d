"""NVIDIA_REQUIRE_CUDA read the way the NVIDIA container toolkit reads it.

`satisfied` below is libnvidia-container's expression grammar written out independently
of the image code (src/cli/dsl.c, dsl_evaluate and dsl_compare_version, at commit
5823754b8577d16fabf25a6ef6a1d58f7ff1e5dd of github.com/NVIDIA/libnvidia-container):
space-separated clauses are ORed, comma-separated constraints within a clause are ANDed;
`cuda` compares with the CUDA version the host driver supports, `driver` with its version.
"""

import pytest

from images.build_args import nvidia_require_cuda
from images.matrix import load_matrix

MATRIX = load_matrix()
CUDA_VARIANTS = [v for v in MATRIX.variants if v.cuda]


def _numbers(version: str) -> list[int]:
    parts = [int(p) for p in version.split(".")]
    while parts and parts[-1] == 0:  # dsl_compare_version skips trailing ".0"s
        parts.pop()
    return parts


def _compare(have: str, op: str, want: str) -> bool:
    a, b = _numbers(have), _numbers(want)
    return {
        "=": a == b,
        "!=": a != b,
        "<": a < b,
        "<=": a <= b,
        ">": a > b,
        ">=": a >= b,
    }[op]


def satisfied(expression: str, host: dict[str, str]) -> bool:
    for clause in filter(None, expression.split(" ")):
        if all(_holds(part, host) for part in filter(None, clause.split(","))):
            return True
    return False


def _holds(constraint: str, host: dict[str, str]) -> bool:
    for op in (">=", "<=", "!=", "=", "<", ">"):
        name, found, value = constraint.partition(op)
        if found:
            if name == "brand":
                return (host["brand"].lower() == value.lower()) == (op == "=")
            return _compare(host[name], op, value)
    raise ValueError(f"invalid expression {constraint!r}")


def host(driver: str, cuda: str, brand: str = "tesla") -> dict[str, str]:
    return {"driver": driver, "cuda": cuda, "brand": brand}


def test_the_grammar_reads_space_as_or_and_comma_as_and():
    # The expression the images carried before: two clauses, either of which admits a host.
    old = "cuda>=12.8 driver>=570.26"
    assert satisfied(old, host(driver="535.183.01", cuda="12.8"))  # cuda clause alone
    assert satisfied(old, host(driver="570.26", cuda="12.2"))  # driver clause alone
    assert not satisfied("cuda>=12.8,driver>=570.26", host(driver="570.26", cuda="12.2"))
    # A base image's forward-compatibility clause: an R535 datacenter driver passes.
    base = "cuda>=12.8 brand=tesla,driver>=535,driver<536"
    assert satisfied(base, host(driver="535.183.01", cuda="12.2"))
    assert not satisfied(base, host(driver="535.183.01", cuda="12.2", brand="geforce"))


@pytest.mark.parametrize("variant", CUDA_VARIANTS, ids=lambda v: v.name)
def test_each_image_states_one_clause_at_its_compatibility_floor(variant):
    expression = nvidia_require_cuda(variant)
    assert " " not in expression  # one clause: nothing ORed in
    major = variant.cuda.split(".")[0]
    floor = variant.compat_driver_floor
    # The floor itself, and the driver the trainer asks for, both start the container.
    assert satisfied(expression, host(driver=floor, cuda=f"{major}.0"))
    assert satisfied(expression, host(driver=variant.min_driver, cuda=variant.cuda))
    # A driver of the previous CUDA major never does, a datacenter one included.
    previous = {"12": ("520.61.05", "11.8"), "13": ("575.57.08", "12.9")}[major]
    for brand in ("tesla", "geforce"):
        assert not satisfied(expression, host(*previous, brand=brand))


def test_cuda_13_refuses_a_12x_driver_and_cuda_12_admits_its_minor_version_floor():
    cu130, cu128 = MATRIX.variant("cu130"), MATRIX.variant("cu128")
    assert not satisfied(nvidia_require_cuda(cu130), host(driver="575.57.08", cuda="12.9"))
    assert satisfied(nvidia_require_cuda(cu130), host(driver="580.65.06", cuda="13.0"))
    # 525.60.13 is CUDA 12.x's minor-version-compatibility floor (NVIDIA, CUDA compatibility).
    assert satisfied(nvidia_require_cuda(cu128), host(driver="525.60.13", cuda="12.0"))
    assert not satisfied(nvidia_require_cuda(cu128), host(driver="525.60.12", cuda="12.0"))


def test_the_cpu_image_requires_nothing():
    assert nvidia_require_cuda(MATRIX.variant("cpu")) == ""
