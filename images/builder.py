"""`python -m images build`: one variant's image, with Docker buildx or with buildah.

The argv is built by pure functions (tests assert them for both engines); `build` only
picks the engine and runs what they return.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from images import locks
from images.build_args import DOCKERFILE, IMAGE_NAME, REPO_ROOT, build_args
from images.matrix import Matrix, Variant

# Where a buildah build sees the CA bundle it is given (pip then trusts it).
CA_BUNDLE_IN_BUILD = "/run/build-ca-bundle.crt"


class BuildError(RuntimeError):
    """The build cannot start: no engine, a bad option, an incomplete lock."""


class BuildFailed(RuntimeError):
    """The engine ran and failed."""


@dataclass(frozen=True)
class BuildRequest:
    variant: Variant
    release: str
    args: dict[str, str]  # Dockerfile build args
    registries: tuple[str, ...] = ()  # push to each when non-empty
    wheelhouse: Path | None = None
    offline: bool = False  # every package from the wheelhouse, no index at all
    ca_bundle: Path | None = None
    cache: str | None = None  # registry ref for the layer cache (read)
    cache_write: bool = False  # also write the cache (needs push rights)
    storage_driver: str | None = None  # buildah only
    image_name: str = IMAGE_NAME  # the repository within each registry
    context: Path = field(default=REPO_ROOT)

    @property
    def tags(self) -> tuple[str, ...]:
        """One name per registry pushed to, else the local name; all carry the versioned tag."""
        tag = self.variant.tag(self.release)
        if not self.registries:
            return (f"{self.image_name}:{tag}",)
        return tuple(f"{r.rstrip('/')}/{self.image_name}:{tag}" for r in self.registries)

    def effective_args(self) -> dict[str, str]:
        args = dict(self.args)
        # A wheelhouse carries torch, and a lock may take torch from PyPI: the torch index
        # is then left out so pip never waits on it (nor picks another file of torch).
        from_index = locks.read_lock(locks.lock_path(self.variant)).needs_torch_index
        args["TORCH_INDEX_URL"] = (
            self.variant.torch_index if from_index and not self.wheelhouse else ""
        )
        if self.offline:
            args["PYPI_INDEX_URL"] = ""
        if self.ca_bundle:
            args["CA_BUNDLE"] = CA_BUNDLE_IN_BUILD
        return args


def _check_options(request: BuildRequest) -> None:
    if request.offline and not request.wheelhouse:
        raise BuildError(
            "--offline needs --wheelhouse DIR holding every locked wheel "
            "(make one with `python -m images wheelhouse <variant> DIR`)"
        )


def make_request(
    matrix: Matrix,
    variant: Variant,
    *,
    revision: str,
    created: str,
    source_url: str,
    **options,
) -> BuildRequest:
    locks.check_lock(matrix, variant)  # before any layer is built
    args = build_args(matrix, variant, revision=revision, created=created, source_url=source_url)
    request = BuildRequest(variant=variant, release=matrix.release, args=args, **options)
    _check_options(request)
    return request


def _common(request: BuildRequest) -> list[str]:
    argv = ["--file", str(DOCKERFILE), "--target", "runtime"]
    for key, value in request.effective_args().items():
        argv += ["--build-arg", f"{key}={value}"]
    for tag in request.tags:
        argv += ["--tag", tag]
    if request.wheelhouse:
        argv += ["--build-context", f"wheelhouse={request.wheelhouse}"]
    return argv


def docker_argv(request: BuildRequest) -> list[str]:
    """docker buildx build: loads the image locally, or pushes every tag when asked."""
    if request.ca_bundle:
        raise BuildError(
            "--ca-bundle is for buildah builds; a Docker daemon uses its host's CA store"
        )
    argv = ["docker", "buildx", "build", *_common(request)]
    if request.cache:
        argv += ["--cache-from", f"type=registry,ref={request.cache}"]
        if request.cache_write:
            argv += ["--cache-to", f"type=registry,ref={request.cache},mode=max"]
    argv.append("--push" if request.registries else "--load")
    return [*argv, str(request.context)]


def buildah_argv(request: BuildRequest, engine: str = "buildah") -> list[str]:
    """buildah bud (or podman build): chroot isolation runs in unprivileged containers too."""
    head = [
        engine,
        *(["--storage-driver", request.storage_driver] if request.storage_driver else []),
    ]
    argv = [*head, "bud" if engine == "buildah" else "build"]
    # docker format: the OCI format drops SHELL (and with it pipefail).
    argv += ["--format", "docker", "--isolation", "chroot", "--network", "host"]
    argv += _common(request)
    if request.ca_bundle:
        argv += ["--volume", f"{request.ca_bundle}:{CA_BUNDLE_IN_BUILD}:ro"]
    if request.cache:
        argv += ["--cache-from", request.cache]
        if request.cache_write:
            argv += ["--cache-to", request.cache]
    return [*argv, str(request.context)]


def buildah_push_argvs(request: BuildRequest, engine: str = "buildah") -> list[list[str]]:
    head = [
        engine,
        *(["--storage-driver", request.storage_driver] if request.storage_driver else []),
    ]
    return [[*head, "push", tag] for tag in request.tags] if request.registries else []


def detect_engine() -> str:
    """docker when a Docker engine answers, else buildah, else podman."""
    if shutil.which("docker"):
        probe = subprocess.run(["docker", "info"], capture_output=True, check=False)
        if probe.returncode == 0:
            return "docker"
    for engine in ("buildah", "podman"):
        if shutil.which(engine):
            return engine
    raise BuildError(
        "no image builder: `docker info` fails and neither buildah nor podman is on PATH "
        "(Debian: apt-get install buildah)"
    )


def commands(request: BuildRequest, engine: str) -> list[list[str]]:
    """Everything `build` runs, in order."""
    if engine == "docker":
        return [docker_argv(request)]
    return [buildah_argv(request, engine), *buildah_push_argvs(request, engine)]


def build(request: BuildRequest, engine: str | None = None) -> tuple[str, ...]:
    """Build (and push) the image; return its tags."""
    engine = engine or detect_engine()
    for argv in commands(request, engine):
        print("+", shlex.join(argv), flush=True)
        if subprocess.run(argv, check=False).returncode != 0:
            raise BuildFailed(
                f"{' '.join(argv[:3])}... failed for variant {request.variant.name!r}"
            )
    return request.tags
