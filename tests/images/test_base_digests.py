"""refresh-bases: each CUDA base tag's digest re-read from a registry, matrix.toml rewritten."""

from __future__ import annotations

import hashlib
import shutil
import tomllib

from images import base_digests
from images.matrix import MATRIX_PATH, load_matrix
from images.release import Registry
from tests.images.registry import image_layout, push_layout

MATRIX = load_matrix()


def test_every_cuda_base_is_read_and_only_moved_digests_are_rewritten():
    pinned = base_digests.pinned_bases(MATRIX)
    # Read from the file itself: every nvidia/cuda base, tag -> digest.
    raw = tomllib.loads(MATRIX_PATH.read_text())["variant"]
    images = [v[key] for v in raw for key in ("base_build", "base_runtime")]
    assert pinned == dict(i.split("@") for i in images if i.startswith("nvidia/cuda"))
    assert len(pinned) == 4
    text = MATRIX_PATH.read_text()
    tag = "nvidia/cuda:13.0.3-base-ubuntu24.04"
    new = "sha256:" + "e" * 64
    refreshed, changes = base_digests.refresh(text, {**pinned, tag: new})
    assert changes == [f"{tag}: {pinned[tag]} -> {new}"]
    # One line changed, the rest of the file (comments, sources) as it was.
    before, after = text.splitlines(), refreshed.splitlines()
    assert [a for a, b in zip(before, after, strict=True) if a != b] == [
        f'base_runtime = "{tag}@{pinned[tag]}"'
    ]
    assert base_digests.refresh(text, pinned) == (text, [])


def test_refresh_reads_the_digests_a_registry_serves(tmp_path, registry):
    # The registry plays Docker Hub: each pinned tag holds a fresh image of its own.
    expected = {}
    for number, tag in enumerate(base_digests.pinned_bases(MATRIX)):
        layout = tmp_path / f"layout{number}"
        index, _ = image_layout(layout, marker=tag.encode())
        push_layout(layout, f"{registry}/{tag}")
        expected[tag] = "sha256:" + hashlib.sha256(index).hexdigest()
    matrix_file = tmp_path / "matrix.toml"
    shutil.copy(MATRIX_PATH, matrix_file)
    changes = base_digests.main(MATRIX, registry, Registry(tls_verify=False), matrix_file)
    assert len(changes) == 4
    refreshed = load_matrix(matrix_file)
    for tag, digest in base_digests.pinned_bases(refreshed).items():
        assert digest == expected[tag]
    assert base_digests.main(refreshed, registry, Registry(tls_verify=False), matrix_file) == []
