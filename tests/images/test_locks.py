import dataclasses
import hashlib
import re
import sys
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.tags import compatible_tags, cpython_tags
from packaging.utils import parse_wheel_filename

from images import locks
from images.matrix import load_matrix

MATRIX = load_matrix()
VARIANTS = MATRIX.variants
CUDA_VARIANTS = [v for v in VARIANTS if v.cuda]
PYPI_DEFAULT = [v for v in VARIANTS if MATRIX.wheels(v).pypi_default]


def lock_of(variant):
    return locks.read_lock(locks.lock_path(variant))


def resolved_files(variant) -> dict[str, str]:
    """The file pip chose for each pin (the comment above it), by normalized name."""
    text = locks.lock_path(variant).read_text()
    found = re.findall(
        r"^# (\S+\.(?:whl|tar\.gz))\n(?:#   requires .*\n)*([a-z0-9-]+)==", text, re.M
    )
    return {name: filename for filename, name in found}


def torch_requires(variant) -> list[Requirement]:
    text = locks.lock_path(variant).read_text()
    return [Requirement(r) for r in re.findall(r"^#   requires (.+)$", text, flags=re.M)]


def linux_environment(python: str) -> dict[str, str]:
    """Marker values inside the image: Linux x86_64, the variant's CPython."""
    return {
        **default_environment(),
        "python_version": python,
        "python_full_version": f"{python}.0",
        "platform_system": "Linux",
        "sys_platform": "linux",
        "platform_machine": "x86_64",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "extra": "",
    }


def train_pins() -> dict[str, str]:
    lines = locks.requirements().values()
    return {locks.normalize(line.split("==")[0]): line.split("==")[1] for line in lines}


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.name)
def test_lock_pins_the_matrix_torch_and_deepspeed(variant):
    lock = lock_of(variant)
    wheels = MATRIX.wheels(variant)
    assert lock.pins["torch"].version == locks.torch_version(variant, wheels)
    # PyPI's default build is the plain release; any other comes from its own index.
    assert lock.needs_torch_index == (not wheels.pypi_default)
    if lock.needs_torch_index:
        assert lock.pins["torch"].version == f"{variant.torch}+{variant.wheel_variant}"
    assert lock.pins["deepspeed"].version == variant.deepspeed
    header = locks.lock_path(variant).read_text().split("\n\n", 1)[0]
    assert f"Python {variant.python}." in header


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.name)
def test_every_resolved_wheel_installs_on_the_variant_python(variant):
    major, minor = map(int, variant.python.split("."))
    supported = {
        (tag.interpreter, tag.abi)
        for tag in [*cpython_tags((major, minor), platforms=["any"]),
                    *compatible_tags((major, minor), platforms=["any"])]
    }  # fmt: skip
    files = resolved_files(variant)
    lock = lock_of(variant)
    assert files, "each pin names the file pip chose"
    for name, filename in files.items():
        if filename.endswith(".tar.gz"):
            continue  # an sdist (DeepSpeed) builds for whatever Python runs it
        wheel_name, version, _, tags = parse_wheel_filename(filename)
        assert locks.normalize(str(wheel_name)) == name
        assert str(version) == lock.pins[name].version, name
        assert any((t.interpreter, t.abi) in supported for t in tags), filename
        assert all(t.platform == "any" or t.platform.endswith("x86_64") for t in tags), filename


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.name)
def test_lock_agrees_with_requirements_train(variant):
    lock = locks.read_lock(locks.lock_path(variant))
    for name, version in train_pins().items():
        if name not in ("torch", "deepspeed"):
            assert lock.pins[name].version == version, name


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.name)
def test_lock_is_complete_or_says_exactly_what_is_missing(variant):
    lock = lock_of(variant)
    wheels = MATRIX.wheels(variant)
    if lock.incomplete:
        # Only torch lacks a hash; none of its CUDA dependencies is half-listed; the
        # header names the index, what is missing and the command that completes it.
        assert not wheels.pypi_default, "a PyPI-default build always locks completely"
        assert lock.unhashed == (locks.torch_requirement(variant, wheels),)
        direct = set(locks.requirements())
        cuda = [n for n in lock.pins if locks.CUDA_DEPENDENCY.match(n) and n not in direct]
        assert cuda == []
        said = " ".join(lock.incomplete)
        assert variant.torch_index in said and "without a hash" in said
        assert "nvidia-*" in said and "triton" in said
        assert said.endswith(f"on Python {variant.python}: python -m images lock {variant.name}")
        return
    assert lock.unhashed == ()
    if variant.cuda:
        nvidia = [name for name in lock.pins if name.startswith("nvidia-")]
        assert nvidia, "a CUDA lock pins every nvidia-* wheel torch needs"


@pytest.mark.parametrize("variant", PYPI_DEFAULT, ids=lambda v: v.name)
def test_pypi_default_lock_is_complete_and_covers_every_torch_dependency(variant):
    lock = lock_of(variant)
    assert lock.incomplete == () and lock.unhashed == ()
    environment = linux_environment(variant.python)
    requires = [
        r for r in torch_requires(variant) if not r.marker or r.marker.evaluate(environment)
    ]
    assert {r.name for r in requires} >= {"sympy", "triton", f"nvidia-nccl-cu{variant.cuda[:2]}"}
    for requirement in requires:
        pin = lock.pins[locks.normalize(requirement.name)]
        assert pin.hashes, pin.name
        assert requirement.specifier.contains(pin.version, prereleases=True), requirement
    # The cuDNN and NCCL the matrix promises are the ones the lock installs.
    major = variant.cuda.split(".")[0]
    assert lock.pins[f"nvidia-cudnn-cu{major}"].version == variant.cudnn
    assert lock.pins[f"nvidia-nccl-cu{major}"].version == variant.nccl
    header = locks.lock_path(variant).read_text().split("\n\n", 1)[0]
    assert f"PyPI's torch=={variant.torch} files" in header and "assumed" in header


def test_cpu_lock_is_complete_and_fully_hashed():
    lock = locks.read_lock(locks.lock_path(MATRIX.variant("cpu")))
    assert lock.incomplete == ()
    assert lock.unhashed == ()
    assert {"setuptools", "wheel"} <= set(lock.pins)  # DeepSpeed builds without isolation


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.name)
def test_deepspeed_is_alone_after_the_marker(variant):
    text = locks.lock_path(variant).read_text()
    before, after = text.split(locks.DEEPSPEED_MARKER + "\n")
    assert "deepspeed==" not in before
    assert re.findall(r"^[a-z0-9-]+==", after, flags=re.M) == ["deepspeed=="]


def test_read_lock_collects_continuation_hashes(tmp_path):
    path = tmp_path / "x.txt"
    path.write_text(
        "# comment\nfoo==1.0 \\\n    --hash=sha256:"
        + "a" * 64
        + " \\\n    --hash=sha256:"
        + "b" * 64
        + "\nbar-baz==2.0\n"
    )
    lock = locks.read_lock(path)
    assert lock.pins["foo"].hashes == ("a" * 64, "b" * 64)
    assert lock.unhashed == ("bar-baz==2.0",)


def test_missing_lock_names_the_command(tmp_path):
    with pytest.raises(locks.LockError, match="python -m images lock cu999"):
        locks.read_lock(tmp_path / "cu999.txt")


def test_lock_inputs_pin_torch_as_its_build_is_published_and_add_build_tools():
    cu126, cu130 = MATRIX.variant("cu126"), MATRIX.variant("cu130")
    inputs = locks.lock_inputs(cu126, MATRIX.wheels(cu126))
    assert f"torch=={cu126.torch}+cu126" in inputs
    assert f"deepspeed=={cu126.deepspeed}" in inputs
    assert inputs[-2:] == list(locks.BUILD_TOOLS)
    assert f"torch=={cu130.torch}" in locks.lock_inputs(cu130, MATRIX.wheels(cu130))


def test_local_wheel_is_hashed_from_its_bytes(tmp_path):
    wheel = tmp_path / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
    wheel.write_bytes(b"not really a wheel")
    item = {
        "download_info": {"url": wheel.as_uri()},
        "metadata": {"name": "torch", "version": "2.13.0+cpu"},
    }
    assert locks.hashes_for(item) == (hashlib.sha256(b"not really a wheel").hexdigest(),)


def report_item(folder: Path, name: str, version: str, requested: bool = False) -> dict:
    """One entry of pip's --report for a local file (hashes_for hashes its bytes)."""
    path = folder / f"{name}-{version}-py3-none-any.whl"
    path.write_bytes(f"{name} {version}".encode())
    return {
        "download_info": {"url": path.as_uri()},
        "metadata": {"name": name, "version": version},
        "requested": requested,
    }


def this_python(variant):
    """The variant as if it ran this interpreter's Python (lock_python accepts it)."""
    return dataclasses.replace(variant, python=f"{sys.version_info.major}.{sys.version_info.minor}")


def test_unreachable_index_lock_stands_in_pypi_torch_and_drops_only_its_cuda_wheels(
    tmp_path, monkeypatch
):
    variant = this_python(MATRIX.variant("cu126"))
    wheels = MATRIX.wheels(variant)
    seen = {}

    def pip_resolution(inputs, indexes, python, *find_links):
        seen.update(inputs=inputs, indexes=indexes, python=python)
        return [
            report_item(tmp_path, "torch", variant.torch, requested=True),
            report_item(tmp_path, "deepspeed", variant.deepspeed, requested=True),
            report_item(tmp_path, "nvidia-ml-py", "13.0", requested=True),  # a direct pin
            report_item(tmp_path, "nvidia_nccl_cu13", "2.29.7"),
            report_item(tmp_path, "cuda-toolkit", "13.0.3.0"),
            report_item(tmp_path, "triton", "3.7.1"),
            report_item(tmp_path, "sympy", "1.14.0"),
        ]

    monkeypatch.setattr(locks, "resolve", pip_resolution)
    monkeypatch.setattr(locks, "index_reachable", lambda url: False)
    text = locks.make_lock(variant, wheels, python=Path(sys.executable))
    assert seen["indexes"] == [locks.PYPI_INDEX]  # the dead index is left out
    assert f"torch=={variant.torch}" in seen["inputs"]
    path = tmp_path / "lock.txt"
    path.write_text(text)
    lock = locks.read_lock(path)
    assert sorted(lock.pins) == ["deepspeed", "nvidia-ml-py", "sympy", "torch"]
    assert lock.unhashed == (f"torch=={variant.torch}+cu126",)
    assert len(lock.incomplete) == 3


def test_pypi_default_lock_resolves_against_pypi_alone_and_hashes_torch(tmp_path, monkeypatch):
    variant = this_python(MATRIX.variant("cu130"))
    seen = {}

    def pip_resolution(inputs, indexes, python, *find_links):
        seen.update(inputs=inputs, indexes=indexes)
        return [
            report_item(tmp_path, "torch", variant.torch, requested=True),
            report_item(tmp_path, "deepspeed", variant.deepspeed, requested=True),
            report_item(tmp_path, "nvidia-nccl-cu13", "2.29.7"),
        ]

    monkeypatch.setattr(locks, "resolve", pip_resolution)
    monkeypatch.setattr(locks, "index_reachable", lambda url: pytest.fail("no index probe"))
    path = tmp_path / "lock.txt"
    path.write_text(locks.make_lock(variant, MATRIX.wheels(variant), python=Path(sys.executable)))
    assert seen["indexes"] == [locks.PYPI_INDEX]
    assert f"torch=={variant.torch}" in seen["inputs"]
    lock = locks.read_lock(path)
    assert lock.incomplete == () and lock.unhashed == ()
    assert lock.pins["torch"].version == variant.torch and not lock.needs_torch_index
    assert "The image build uses\n# PyPI only." in path.read_text()


def test_lock_refuses_an_interpreter_of_another_python():
    variant = dataclasses.replace(MATRIX.variant("cpu"), python="3.99")
    with pytest.raises(locks.LockError, match=r"runs Python 3\.99 but .* is Python 3\.\d+"):
        locks.lock_python(variant, Path(sys.executable))


def test_lock_without_the_variant_python_names_the_option(monkeypatch):
    variant = dataclasses.replace(MATRIX.variant("cpu"), python="3.99")
    monkeypatch.setenv("PATH", "")
    with pytest.raises(locks.LockError, match=r"no python3\.99 on PATH.*--python"):
        locks.lock_python(variant)


def test_lock_python_defaults_to_this_interpreter_when_it_matches():
    assert locks.lock_python(this_python(MATRIX.variant("cpu"))) == sys.executable


def test_wheelhouse_refuses_an_incomplete_lock(tmp_path, monkeypatch):
    variant = MATRIX.variant("cu126")
    (tmp_path / f"{variant.name}.txt").write_text(
        f"{locks.INCOMPLETE_MARKER} unreachable\n"
        f"{locks.torch_requirement(variant, MATRIX.wheels(variant))}\n"
    )
    monkeypatch.setattr(locks, "LOCKS_DIR", tmp_path)
    with pytest.raises(locks.LockError, match="is incomplete; regenerate it first"):
        locks.fill_wheelhouse(variant, tmp_path / "wheels")
    assert not (tmp_path / "wheels").exists()
