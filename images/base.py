"""Make the cpu variant's Debian base locally, for machines that cannot pull from a registry.

debootstrap writes a minimal Debian root file system; buildah turns it into an image
tagged with the names the Dockerfile's FROM lines use, so the build never pulls.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

from images.errors import CannotRun, RunFailed
from images.matrix import Variant

# The Debian suite each bootstrappable base image name stands for.
DEBIAN_SUITES = {"bookworm": "bookworm", "12": "bookworm"}


def debian_suite(variant: Variant) -> str:
    """The suite to debootstrap for a variant whose bases are Debian images."""
    suites = {_suite_of(image) for image in (variant.base_build, variant.base_runtime)}
    if None in suites or len(suites) != 1:
        raise CannotRun(
            f"variant {variant.name!r}: bootstrap-base makes Debian bases only, but its bases "
            f"are {variant.base_build!r} and {variant.base_runtime!r}; "
            "pull those from their registry instead"
        )
    return suites.pop()


def _suite_of(image: str) -> str | None:
    repository, _, tag = image.rpartition(":")
    if repository.rsplit("/", 1)[-1] != "debian":
        return None
    return DEBIAN_SUITES.get(tag.split("-")[0])


def buildah_command(storage_driver: str | None) -> list[str]:
    return ["buildah", *(["--storage-driver", storage_driver] if storage_driver else [])]


def _container(variant: Variant) -> str:
    return f"{variant.name}-base-bootstrap"


def qualified(image: str) -> str:
    """Docker's reading of a short name (debian:12 is docker.io/library/debian:12).

    Tagging the base under that name lets buildah match the FROM line to it locally.
    """
    first, _, rest = image.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return image
    return f"docker.io/{image}" if rest else f"docker.io/library/{image}"


def bootstrap_commands(
    variant: Variant, rootfs: Path, storage_driver: str | None
) -> list[list[str]]:
    """The commands that make the base image, in order (pure: tests assert them)."""
    buildah = buildah_command(storage_driver)
    container = _container(variant)
    tags = sorted({qualified(variant.base_build), qualified(variant.base_runtime)})
    commands = [
        ["debootstrap", "--variant=minbase", debian_suite(variant), str(rootfs)],
        ["tar", "-C", str(rootfs), "-cf", f"{rootfs}.tar", "."],
        [*buildah, "from", "--name", container, "scratch"],
        [*buildah, "add", container, f"{rootfs}.tar", "/"],
        [*buildah, "config", "--cmd", "/bin/bash", container],
        [*buildah, "commit", "--rm", container, tags[0]],
    ]
    commands += [[*buildah, "tag", tags[0], tag] for tag in tags[1:]]
    return commands


def bootstrap_base(variant: Variant, storage_driver: str | None = None) -> list[str]:
    """Make the variant's base image(s); return the tags made."""
    for tool in ("debootstrap", "buildah", "tar"):
        if shutil.which(tool) is None:
            raise CannotRun(
                f"bootstrap-base needs {tool!r} on PATH (Debian: apt-get install {tool})"
            )
    with tempfile.TemporaryDirectory(prefix="debian-base-") as workdir:
        rootfs = Path(workdir) / "rootfs"
        commands = bootstrap_commands(variant, rootfs, storage_driver)
        # A container left by an interrupted run would block `buildah from --name`.
        leftover = [*buildah_command(storage_driver), "rm", _container(variant)]
        subprocess.run(leftover, check=False, capture_output=True)
        for command in commands:
            if subprocess.run(command, check=False).returncode != 0:
                raise RunFailed(f"{' '.join(command)} failed (its output is above)")
    return sorted({qualified(variant.base_build), qualified(variant.base_runtime)})
