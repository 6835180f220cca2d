import os
import re
import urllib.request
from pathlib import Path

import pytest

from images import locks
from images.matrix import load_matrix

MATRIX = load_matrix()
VARIANTS = MATRIX.variants
CUDA_VARIANTS = [v for v in VARIANTS if v.cuda]
HASH = "--hash=sha256:"


def lock_of(variant):
    return locks.read_lock(locks.lock_path(variant))


def train_pins() -> dict[str, str]:
    """requirements-train.txt's exact pins, read here without the code under test."""
    pins = {}
    for line in locks.TRAIN_REQUIREMENTS.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, version = line.split("==")
            pins[re.sub(r"[-_.]+", "-", name).lower()] = version
    return pins


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.name)
def test_every_committed_lock_passes_its_completeness_check(variant):
    lock = locks.check_lock(MATRIX, variant)
    assert lock.unhashed == ()
    assert lock.pins["deepspeed"].version == variant.deepspeed
    expected_torch = variant.torch if variant.cuda else f"{variant.torch}+cpu"
    assert lock.pins["torch"].version == expected_torch
    header = locks.lock_path(variant).read_text().split("\n", 1)[0]
    assert f"Python {variant.python}." in header


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.name)
def test_lock_agrees_with_requirements_train(variant):
    lock = lock_of(variant)
    for name, version in train_pins().items():
        if name not in ("torch", "deepspeed"):
            assert lock.pins[name].version == version, name
    # tensorboard 2.20 imports pkg_resources, gone in setuptools 81: the image keeps 80.x.
    assert lock.pins["setuptools"].version.split(".")[0] == "80"


@pytest.mark.parametrize("variant", CUDA_VARIANTS, ids=lambda v: v.name)
def test_cuda_lock_installs_the_cudnn_and_nccl_the_matrix_promises(variant):
    lock = lock_of(variant)
    major = variant.cuda.split(".")[0]
    assert lock.pins[f"nvidia-cudnn-cu{major}"].version == variant.cudnn
    assert lock.pins[f"nvidia-nccl-cu{major}"].version == variant.nccl
    assert "triton" in lock.pins


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.name)
def test_deepspeed_is_alone_after_the_marker(variant):
    text = locks.lock_path(variant).read_text()
    before, after = text.split(locks.DEEPSPEED_MARKER + "\n")
    assert "deepspeed==" not in before
    assert re.findall(r"^[a-z0-9-]+==", after, flags=re.M) == ["deepspeed=="]


def test_read_lock_reads_uv_entries(tmp_path):
    path = tmp_path / "x.txt"
    path.write_text(
        "# header\nfoo==1.0 \\\n"
        f"    {HASH}{'a' * 64} \\\n    {HASH}{'b' * 64}\n    # via\n    #   -r r.txt\n"
        "bar-baz==2.0\n    # via foo\n"
        f"\n{locks.DEEPSPEED_MARKER}\ndeepspeed==0.1 \\\n    {HASH}{'c' * 64}\n"
    )
    lock = locks.read_lock(path)
    assert lock.pins["foo"].hashes == ("a" * 64, "b" * 64)
    assert lock.unhashed == ("bar-baz==2.0",)
    assert lock.deepspeed_last


def test_missing_lock_names_the_command(tmp_path):
    with pytest.raises(locks.LockError, match="python -m images lock cu999"):
        locks.read_lock(tmp_path / "cu999.txt")


def _broken_copy(tmp_path, monkeypatch, variant, old, new):
    """A copy of the committed lock with the first match of the regex `old` replaced."""
    text, count = re.subn(old, new, locks.lock_path(variant).read_text(), count=1)
    assert count == 1, old
    (tmp_path / f"{variant.name}.txt").write_text(text)
    monkeypatch.setattr(locks, "LOCKS_DIR", tmp_path)
    monkeypatch.setattr(locks, "REPO_ROOT", tmp_path)


@pytest.mark.parametrize(
    ("old", "new", "said"),
    [
        (r"torch==2\.13\.0\+cpu", "torch==2.12.0+cpu", "torch is 2.12.0+cpu, the matrix says"),
        (r"(absl-py==\S+) \\\n(    --hash=\S+( \\)?\n)+", r"\1\n", "pins without a hash: absl-py"),
        (re.escape(locks.DEEPSPEED_MARKER), "# moved", "DeepSpeed is not the only entry below"),
    ],
)
def test_check_lock_refuses_a_lock_the_image_cannot_be_built_from(
    tmp_path, monkeypatch, old, new, said
):
    _broken_copy(tmp_path, monkeypatch, MATRIX.variant("cpu"), old, new)
    with pytest.raises(locks.LockError, match=re.escape(said)) as caught:
        locks.check_lock(MATRIX, MATRIX.variant("cpu"))
    assert str(caught.value).endswith("regenerate it with `python -m images lock cpu`")


def test_wheelhouse_refuses_a_bad_lock_before_downloading(tmp_path, monkeypatch):
    _broken_copy(tmp_path, monkeypatch, MATRIX.variant("cpu"), r"torch==\S+", "torch==1+cpu")
    with pytest.raises(locks.LockError, match="cannot build the cpu image"):
        locks.fill_wheelhouse(MATRIX, MATRIX.variant("cpu"), tmp_path / "wheels")
    assert not (tmp_path / "wheels").exists()


def test_torch_build_not_on_pypi_and_nowhere_reachable_is_refused(tmp_path, monkeypatch):
    cpu = MATRIX.variant("cpu")
    monkeypatch.setattr(locks, "index_reachable", lambda url: False)
    with pytest.raises(locks.LockError, match=r"torch==2\.13\.0\+cpu is not reachable") as caught:
        locks.torch_sources(cpu, MATRIX.wheels(cpu), tmp_path)
    assert cpu.torch_index in str(caught.value) and str(tmp_path) in str(caught.value)
    wheel = tmp_path / f"torch-{cpu.torch}+cpu-cp{cpu.python.replace('.', '')}-none-any.whl"
    wheel.write_bytes(b"")
    sources = locks.torch_sources(cpu, MATRIX.wheels(cpu), tmp_path)
    assert sources == ["--index-url", locks.PYPI_INDEX, "--find-links", str(tmp_path)]


def test_pypi_default_builds_lock_from_pypi_alone(monkeypatch):
    monkeypatch.setattr(locks, "index_reachable", lambda url: pytest.fail("no index probe"))
    for variant in CUDA_VARIANTS:
        assert MATRIX.wheels(variant).pypi_default, f"{variant.name} needs a non-PyPI index"
        assert locks.torch_sources(variant, MATRIX.wheels(variant), None) == [
            "--index-url",
            locks.PYPI_INDEX,
        ]


def _pypi_reachable() -> bool:
    try:
        with urllib.request.urlopen(f"{locks.PYPI_INDEX}/uv/", timeout=10):
            return True
    except OSError:
        return False


@pytest.mark.timeout(300)
def test_uv_regenerates_the_committed_cpu_lock(tmp_path):
    """A real `uv pip compile` run: the same direct pins, all hashed, DeepSpeed last."""
    cpu = MATRIX.variant("cpu")
    find_links = next(
        (Path(p) for p in os.environ.get("PIP_FIND_LINKS", "").split() if Path(p).is_dir()), None
    )
    if not _pypi_reachable():
        pytest.skip("needs PyPI")
    if locks.local_torch(cpu, find_links) is None:
        if not locks.index_reachable(cpu.torch_index):
            pytest.skip("needs the cpu torch wheel: its index or a PIP_FIND_LINKS folder")
        find_links = None
    text = locks.make_lock(MATRIX, cpu, find_links)
    path = tmp_path / "cpu.txt"
    path.write_text(text)
    fresh = locks.read_lock(path)
    committed = lock_of(cpu)
    assert fresh.unhashed == () and fresh.deepspeed_last
    for name in [*train_pins(), "torch"]:
        assert fresh.pins[name] == committed.pins[name], name
    assert "python -m images lock cpu" in text.splitlines()[3]
