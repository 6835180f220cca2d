import hashlib
import json
import os
import re
import subprocess
import sys

import pytest

from images import locks
from images.matrix import load_matrix

MATRIX = load_matrix()
VARIANTS = MATRIX.variants


def train_pins() -> dict[str, str]:
    lines = locks.requirements().values()
    return {locks.normalize(line.split("==")[0]): line.split("==")[1] for line in lines}


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.name)
def test_lock_pins_the_matrix_torch_and_deepspeed(variant):
    lock = locks.read_lock(locks.lock_path(variant))
    assert lock.pins["torch"].version == locks.torch_local_version(variant)
    assert lock.pins["torch"].version.startswith(f"{variant.torch}+")
    assert lock.pins["deepspeed"].version == variant.deepspeed


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.name)
def test_lock_agrees_with_requirements_train(variant):
    lock = locks.read_lock(locks.lock_path(variant))
    for name, version in train_pins().items():
        if name not in ("torch", "deepspeed"):
            assert lock.pins[name].version == version, name


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.name)
def test_lock_is_complete_or_says_exactly_what_is_missing(variant):
    lock = locks.read_lock(locks.lock_path(variant))
    if lock.incomplete:
        # Only torch may lack a hash, and the header says how to regenerate the lock.
        assert lock.unhashed == (locks.torch_requirement(variant),)
        assert any(f"python -m images lock {variant.name}" in r for r in lock.incomplete)
        return
    assert lock.unhashed == ()
    if variant.cuda:
        nvidia = [name for name in lock.pins if name.startswith("nvidia-")]
        assert nvidia, "a CUDA lock pins every nvidia-* wheel torch needs"


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


def test_lock_inputs_pin_torch_from_the_variant_index_and_add_build_tools():
    variant = next(v for v in VARIANTS if v.cuda)
    inputs = locks.lock_inputs(variant)
    assert f"torch=={variant.torch}+{variant.wheel_variant}" in inputs
    assert f"deepspeed=={variant.deepspeed}" in inputs
    assert inputs[-2:] == list(locks.BUILD_TOOLS)


def test_local_wheel_is_hashed_from_its_bytes(tmp_path):
    wheel = tmp_path / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
    wheel.write_bytes(b"not really a wheel")
    item = {
        "download_info": {"url": wheel.as_uri()},
        "metadata": {"name": "torch", "version": "2.13.0+cpu"},
    }
    assert locks.hashes_for(item) == (hashlib.sha256(b"not really a wheel").hexdigest(),)


def test_render_marks_an_unreachable_torch_index_and_leaves_torch_unhashed(tmp_path):
    variant = next(v for v in VARIANTS if v.cuda)
    wheel = tmp_path / "w.whl"
    wheel.write_bytes(b"x")
    items = [
        {"download_info": {"url": wheel.as_uri()}, "metadata": {"name": n, "version": ver}}
        for n, ver in (
            ("torch", f"{variant.torch}+cpu"),
            ("DeepSpeed", variant.deepspeed),
            ("Typing_Extensions", "4.0"),
        )
    ]
    text = locks.render_lock(variant, items, ["index unreachable", "regenerate: X"])
    path = tmp_path / "lock.txt"
    path.write_text(text)
    lock = locks.read_lock(path)
    assert lock.incomplete == ("index unreachable", "regenerate: X")
    assert lock.unhashed == (locks.torch_requirement(variant),)
    assert lock.pins["typing-extensions"].hashes == (hashlib.sha256(b"x").hexdigest(),)


def test_lock_refuses_another_python(monkeypatch):
    import dataclasses

    variant = dataclasses.replace(MATRIX.variant("cpu"), python="3.99")
    with pytest.raises(locks.LockError, match=r"runs Python 3\.99"):
        locks.make_lock(variant)


def test_placeholder_torch_is_a_wheel_pip_resolves_without_any_index(tmp_path):
    variant = next(v for v in VARIANTS if v.cuda)
    folder = locks.placeholder_torch(variant, tmp_path)
    report = tmp_path / "report.json"
    command = [
        *(sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet"),
        *("--no-index", "--find-links", str(folder), "--report", str(report)),
        locks.torch_requirement(variant),
    ]
    env = {**os.environ, "PIP_CONFIG_FILE": os.devnull}
    result = subprocess.run(command, capture_output=True, text=True, check=False, env=env)
    assert result.returncode == 0, result.stderr
    installs = json.loads(report.read_text())["install"]
    assert [(i["metadata"]["name"], i["metadata"]["version"]) for i in installs] == [
        ("torch", locks.torch_local_version(variant))
    ]


def test_wheelhouse_refuses_an_incomplete_lock(tmp_path, monkeypatch):
    variant = next(v for v in VARIANTS if v.cuda)
    (tmp_path / f"{variant.name}.txt").write_text(
        f"{locks.INCOMPLETE_MARKER} unreachable\n{locks.torch_requirement(variant)}\n"
    )
    monkeypatch.setattr(locks, "LOCKS_DIR", tmp_path)
    with pytest.raises(locks.LockError, match="is incomplete; regenerate it first"):
        locks.fill_wheelhouse(variant, tmp_path / "wheels")
    assert not (tmp_path / "wheels").exists()
