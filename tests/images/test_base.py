import dataclasses
from pathlib import Path

import pytest

from images import base
from images.errors import CannotRun
from images.matrix import load_matrix

MATRIX = load_matrix()
CPU = MATRIX.variant("cpu")


def test_cpu_base_is_debootstrapped_and_tagged_as_the_dockerfile_from_names():
    commands = base.bootstrap_commands(CPU, Path("/tmp/x/rootfs"), "vfs")
    assert commands[0] == ["debootstrap", "--variant=minbase", "bookworm", "/tmp/x/rootfs"]
    assert all(c[:3] == ["buildah", "--storage-driver", "vfs"] for c in commands[2:])
    commit = next(c for c in commands if "commit" in c)
    tags = {commit[-1]} | {c[-1] for c in commands if "tag" in c}
    assert tags == {base.qualified(CPU.base_build), base.qualified(CPU.base_runtime)}


def test_distinct_build_and_runtime_names_both_get_tagged():
    variant = dataclasses.replace(CPU, base_build="debian:bookworm", base_runtime="debian:12-slim")
    commands = base.bootstrap_commands(variant, Path("/r"), None)
    first, second = "docker.io/library/debian:12-slim", "docker.io/library/debian:bookworm"
    assert commands[-2] == ["buildah", "commit", "--rm", "cpu-base-bootstrap", first]
    assert commands[-1] == ["buildah", "tag", first, second]


@pytest.mark.parametrize(
    ("name", "qualified"),
    [
        ("debian:bookworm-slim", "docker.io/library/debian:bookworm-slim"),
        ("library/debian:12", "docker.io/library/debian:12"),
        ("docker.io/library/debian:12", "docker.io/library/debian:12"),
        ("registry.example:5000/debian:12", "registry.example:5000/debian:12"),
        ("localhost/debian:12", "localhost/debian:12"),
    ],
)
def test_short_names_are_read_as_docker_reads_them(name, qualified):
    assert base.qualified(name) == qualified


@pytest.mark.parametrize("variant", [v for v in MATRIX.variants if v.cuda], ids=lambda v: v.name)
def test_cuda_bases_cannot_be_bootstrapped(variant):
    with pytest.raises(CannotRun, match="makes Debian bases only"):
        base.debian_suite(variant)
