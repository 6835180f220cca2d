"""bench/image.py reads the local build's size as buildah prints it."""

from __future__ import annotations

from bench.image import human_bytes


def test_the_image_size_is_read_as_buildah_prints_it():
    # cmd/buildah/images.go prints sizes in powers of 1000, three significant digits.
    assert human_bytes("1.23 GB") == 1_230_000_000
    assert human_bytes("512 kB") == 512_000
    assert human_bytes("7 B") == 7
    assert human_bytes("") is None
    assert human_bytes("big") is None
