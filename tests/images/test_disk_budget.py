import json
from pathlib import Path

import pytest

from images import disk_budget, locks, wheel_sizes
from images.matrix import load_matrix

MATRIX = load_matrix()
CU130 = MATRIX.variant("cu130")
GLIBC = MATRIX.os_of(CU130).glibc  # Ubuntu 24.04: 2.39
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
    """A PyPI JSON simple API that knows every pin of the lock: the locked file the image
    installs, and a larger one for another platform whose hash the lock also pins."""
    lock = locks.read_lock(locks.lock_path(CU130))

    def files(name: str) -> list[dict]:
        pin = lock.pins[locks.normalize(name)]
        size = sizes.get(locks.normalize(name), 1000)
        stem = f"{locks.normalize(name).replace('-', '_')}-{pin.version}-py3-none"
        aarch64 = {"filename": f"{stem}-manylinux_2_28_aarch64.whl", "size": 99 * size}
        fitting = {"filename": f"{stem}-any.whl", "size": size}
        for file, digest in [(aarch64, pin.hashes[-1]), (fitting, pin.hashes[0])]:
            file.update(url=f"https://files.example/{file['filename']}", hashes={"sha256": digest})
        return [aarch64, fitting] if len(pin.hashes) > 1 else [fitting]

    return files, lock


def unpacks_threefold(entry: dict) -> float:
    return 3.0 * entry["size"]


def budget(*args, **kwargs) -> disk_budget.Budget:
    return disk_budget.budget(CU130, GLIBC, *args, unpacked=unpacks_threefold, **kwargs)


def test_image_size_reads_the_amd64_manifest_of_an_index():
    asked = []

    def inspect(reference):
        asked.append(reference)
        return fake_registry(reference)

    assert disk_budget.image_size("nvidia/cuda:13.0.1-devel-ubuntu24.04", inspect) == 3 * GB
    assert asked[1] == "nvidia/cuda@sha256:amd"


def test_wheels_count_the_file_the_image_installs_and_what_it_unpacks_to():
    files, lock = fake_index({"torch": 10**9, "nvidia-nccl-cu13": 10**8})
    tags = wheel_sizes.image_tags(CU130.python, GLIBC)
    downloaded, installed, unknown = disk_budget.wheel_bytes(lock, tags, files, unpacks_threefold)
    others = len(lock.pins) - 2
    assert unknown == []
    # The x86_64 file of each pin, not the larger aarch64 one.
    assert downloaded == 10**9 + 10**8 + others * 1000
    assert installed == 3 * downloaded


def test_the_virtualenv_of_a_recorded_build_is_counted_within_one_percent():
    """The cu130 lock installed with Python 3.12 and DeepSpeed's ops built as the Dockerfile
    does: the virtualenv held 5,566,297,979 bytes (`du -sb`, 2026-12-07). Its files as PyPI
    listed them that day, and their zip directories' sizes, are in data/cu130_files.json."""
    recorded = json.loads((Path(__file__).parent / "data" / "cu130_files.json").read_text())
    measured = 5_566_297_979
    lock = locks.read_lock(locks.lock_path(CU130))
    assert set(recorded) == set(lock.pins)

    def files(name):
        file = recorded[locks.normalize(name)]
        digest = lock.pins[locks.normalize(name)].hashes[0]
        return [{"filename": file["file"], "size": file["size"], "hashes": {"sha256": digest}}]

    def unpacked(entry):
        file = next(f for f in recorded.values() if f["file"] == entry["filename"])
        return file["members"] + wheel_sizes.PYC_PER_SOURCE * file["modules"]

    tags = wheel_sizes.image_tags(CU130.python, GLIBC)
    _, installed, unknown = disk_budget.wheel_bytes(lock, tags, files, unpacked)
    assert unknown == []
    assert installed == pytest.approx(measured, rel=0.01)


def test_budget_counts_compressed_and_unpacked_copies_and_the_cache_export():
    files, _ = fake_index({})
    plan = budget(fake_registry, files)
    assert plan.base_build == plan.base_runtime == 3 * GB
    # Bases: 6 GB compressed kept beside their unpacked snapshots (7.37/2.92 times), and
    # the runtime base unpacked again in Docker; the download; three virtualenvs; the
    # image's layers compressed for the export (about the wheels' size).
    unpacked = 7.37 / 2.92
    expected = 6 * GB + 6 * GB * unpacked + 3 * GB * unpacked + 2 * plan.wheels + 3 * plan.venv
    assert plan.needed == pytest.approx(expected)
    cached = budget(fake_registry, files, cache_write=True)
    assert cached.needed == pytest.approx(expected + plan.wheels)  # the build stage, compressed


def test_peak_use_is_the_most_used_above_the_sample_before_the_build():
    assert disk_budget.peak_use([10 * GB, 14 * GB, 31 * GB, 12 * GB]) == 21 * GB
    assert disk_budget.peak_use([]) == 0


def test_a_build_that_used_more_than_its_budget_fails_the_check(monkeypatch, tmp_path, capsys):
    files, _ = fake_index({})
    computed = budget(fake_registry, files)
    monkeypatch.setattr(disk_budget, "budget", lambda variant, glibc, cache_write: computed)
    log = tmp_path / "disk-used.log"
    base = 40 * GB
    log.write_text(f"{base:.0f}\n{base + computed.needed - GB:.0f}\n{base:.0f}\n")
    assert disk_budget.main(MATRIX, CU130, [tmp_path], peak_log=log) == 0
    log.write_text(f"{base:.0f}\n{base + computed.needed + GB:.0f}\n")
    assert disk_budget.main(MATRIX, CU130, [tmp_path], peak_log=log) == 1
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith(f"error: the cu130 build used {(computed.needed + GB) / GB:.1f} GB")
    assert last.endswith("images/disk_budget.py undercounts")


def test_what_cannot_be_read_is_named_not_guessed():
    def no_docker(reference):
        raise FileNotFoundError("docker")

    def offline(name):
        raise OSError("unreachable")

    plan = budget(no_docker, offline)
    assert plan.needed == 0
    assert plan.unknown[:2] == (
        f"base image {CU130.base_build}",
        f"base image {CU130.base_runtime}",
    )
    assert "wheel torch==2.13.0" in plan.unknown
    assert any("not counted: wheel torch==2.13.0" in line for line in plan.lines())


def test_too_little_free_space_fails_before_the_build(monkeypatch, tmp_path, capsys):
    files, _ = fake_index({})
    computed = budget(fake_registry, files)
    monkeypatch.setattr(disk_budget, "budget", lambda variant, glibc, cache_write: computed)
    monkeypatch.setattr(
        disk_budget.shutil, "disk_usage", lambda path: type("U", (), {"free": 5 * GB})
    )
    assert disk_budget.main(MATRIX, CU130, [Path("/nonexistent"), tmp_path]) == 1
    out = capsys.readouterr().out
    assert f"free on {tmp_path}" in out
    needed = f"{computed.needed / GB:.1f}"
    assert out.splitlines()[-1] == (
        f"error: the cu130 build needs about {needed} GB and {tmp_path} has 5.0 GB free: "
        "free more space or use a larger runner"
    )
