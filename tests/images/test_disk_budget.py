from pathlib import Path

import pytest

from images import disk_budget, locks
from images.matrix import load_matrix

MATRIX = load_matrix()
CU130 = MATRIX.variant("cu130")
GB = 1e9


def fake_registry(reference: str) -> dict:
    """An index that points at the amd64 manifest, as Docker Hub serves nvidia/cuda."""
    if "@" in reference:
        return {"layers": [{"size": 2 * 10**9}, {"size": 10**9}]}
    return {
        "manifests": [
            {"digest": "sha256:arm", "platform": {"architecture": "arm64", "os": "linux"}},
            {"digest": "sha256:amd", "platform": {"architecture": "amd64", "os": "linux"}},
        ]
    }


def fake_index(sizes: dict[str, int]):
    """A PyPI JSON simple API that knows every pin of the lock, one file each."""
    lock = locks.read_lock(locks.lock_path(CU130))

    def files(name: str) -> list[dict]:
        pin = lock.pins[locks.normalize(name)]
        size = sizes.get(locks.normalize(name), 1000)
        other_file = {"hashes": {"sha256": "0" * 64}, "size": 99 * size}
        return [other_file, {"hashes": {"sha256": pin.hashes[0]}, "size": size}]

    return files, lock


def test_image_size_reads_the_amd64_manifest_of_an_index():
    asked = []

    def inspect(reference):
        asked.append(reference)
        return fake_registry(reference)

    assert disk_budget.image_size("nvidia/cuda:13.0.1-devel-ubuntu24.04", inspect) == 3 * GB
    assert asked[1] == "nvidia/cuda@sha256:amd"


def test_wheels_count_the_locked_file_and_what_it_installs():
    files, lock = fake_index({"torch": 10**9, "nvidia-nccl-cu13": 10**8})
    downloaded, installed, unknown = disk_budget.wheel_bytes(lock, files)
    others = len(lock.pins) - 2
    assert unknown == []
    assert downloaded == 10**9 + 10**8 + others * 1000
    # torch unpacks like the cpu wheel measured (3.65x), CUDA libraries like cufft (1.34x).
    assert installed == pytest.approx(3.65e9 + 1.34e8 + others * 1000 * 3.65, rel=1e-3)


def test_budget_counts_compressed_and_unpacked_copies_and_the_cache_export():
    files, _ = fake_index({})
    plan = disk_budget.budget(CU130, fake_registry, files)
    assert plan.base_build == plan.base_runtime == 3 * GB
    # Bases: 6 GB compressed kept beside their unpacked snapshots (7.37/2.92 times), and
    # the runtime base unpacked again in Docker; the download; three virtualenvs; the
    # image's layers compressed for the export (about the wheels' size).
    unpacked = 7.37 / 2.92
    expected = 6 * GB + 6 * GB * unpacked + 3 * GB * unpacked + 2 * plan.wheels + 3 * plan.venv
    assert plan.needed == pytest.approx(expected)
    cached = disk_budget.budget(CU130, fake_registry, files, cache_write=True)
    assert cached.needed == pytest.approx(expected + plan.wheels)  # the build stage, compressed


def test_peak_use_is_the_most_used_above_the_sample_before_the_build():
    assert disk_budget.peak_use([10 * GB, 14 * GB, 31 * GB, 12 * GB]) == 21 * GB
    assert disk_budget.peak_use([]) == 0


def test_a_build_that_used_more_than_its_budget_fails_the_check(monkeypatch, tmp_path, capsys):
    files, _ = fake_index({})
    computed = disk_budget.budget(CU130, fake_registry, files)
    monkeypatch.setattr(disk_budget, "budget", lambda variant, cache_write: computed)
    log = tmp_path / "disk-used.log"
    base = 40 * GB
    log.write_text(f"{base:.0f}\n{base + computed.needed - GB:.0f}\n{base:.0f}\n")
    assert disk_budget.main(CU130, [tmp_path], peak_log=log) == 0
    log.write_text(f"{base:.0f}\n{base + computed.needed + GB:.0f}\n")
    assert disk_budget.main(CU130, [tmp_path], peak_log=log) == 1
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith(f"error: the cu130 build used {(computed.needed + GB) / GB:.1f} GB")
    assert last.endswith("images/disk_budget.py undercounts")


def test_what_cannot_be_read_is_named_not_guessed():
    def no_docker(reference):
        raise FileNotFoundError("docker")

    def offline(name):
        raise OSError("unreachable")

    plan = disk_budget.budget(CU130, no_docker, offline)
    assert plan.needed == 0
    assert plan.unknown[:2] == (
        f"base image {CU130.base_build}",
        f"base image {CU130.base_runtime}",
    )
    assert "wheel torch==2.13.0" in plan.unknown
    assert any("not counted: wheel torch==2.13.0" in line for line in plan.lines())


def test_too_little_free_space_fails_before_the_build(monkeypatch, tmp_path, capsys):
    files, _ = fake_index({})
    computed = disk_budget.budget(CU130, fake_registry, files)
    monkeypatch.setattr(disk_budget, "budget", lambda variant, cache_write: computed)
    monkeypatch.setattr(
        disk_budget.shutil, "disk_usage", lambda path: type("U", (), {"free": 5 * GB})
    )
    assert disk_budget.main(CU130, [Path("/nonexistent"), tmp_path]) == 1
    out = capsys.readouterr().out
    assert f"free on {tmp_path}" in out
    needed = f"{computed.needed / GB:.1f}"
    assert out.splitlines()[-1] == (
        f"error: the cu130 build needs about {needed} GB and {tmp_path} has 5.0 GB free: "
        "free more space or use a larger runner"
    )
