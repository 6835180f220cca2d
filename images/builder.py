"""`python -m images build|push`: one variant's image, with Docker buildx or with buildah.

The image is always built into the local store under one local tag; pushing tags and
pushes THAT image (what the smoke test ran), never a rebuild, and reports each registry's
digest. The argv is built by pure functions (tests assert them for both engines); `build`
and `push` only pick the engine and run what they return.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from images import locks
from images.build_args import DOCKERFILE, IMAGE_NAME, REPO_ROOT, build_args
from images.errors import CannotRun, RunFailed
from images.matrix import Matrix, Variant

# Where a buildah build sees the CA bundle it is given (pip then trusts it).
CA_BUNDLE_IN_BUILD = "/run/build-ca-bundle.crt"


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
    def local_tag(self) -> str:
        """The name the build gives the image in the local store (smoke reads it there)."""
        return f"{self.image_name}:{self.variant.tag(self.release)}"

    @property
    def tags(self) -> tuple[str, ...]:
        """The registry names the local image is pushed under, one per registry."""
        tag = self.variant.tag(self.release)
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
        raise CannotRun(
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


def _common(request: BuildRequest, tag: str | None = None) -> list[str]:
    argv = ["--file", str(DOCKERFILE), "--target", "runtime"]
    for key, value in request.effective_args().items():
        argv += ["--build-arg", f"{key}={value}"]
    argv += ["--tag", tag or request.local_tag]
    if request.wheelhouse:
        argv += ["--build-context", f"wheelhouse={request.wheelhouse}"]
    return argv


def _cache(request: BuildRequest) -> list[str]:
    if not request.cache:
        return []
    argv = ["--cache-from", f"type=registry,ref={request.cache}"]
    if request.cache_write:
        argv += ["--cache-to", f"type=registry,ref={request.cache},mode=max"]
    return argv


def docker_argv(request: BuildRequest) -> list[str]:
    """docker buildx build, loaded into the local store (pushed later, as tested)."""
    if request.ca_bundle:
        raise CannotRun(
            "--ca-bundle is for buildah builds; a Docker daemon uses its host's CA store"
        )
    argv = ["docker", "buildx", "build", *_common(request), *_cache(request)]
    return [*argv, "--load", str(request.context)]


def stage_argv(request: BuildRequest, staging_ref: str, metadata: Path) -> list[str]:
    """docker buildx build pushed straight to a staging tag, with an SBOM and full
    provenance attached to the pushed index (BuildKit attestations: `--load` into Docker's
    image store would drop them). The digest lands in `metadata` (containerimage.digest)."""
    argv = ["docker", "buildx", "build", *_common(request, staging_ref), *_cache(request)]
    argv += ["--sbom=true", "--provenance=mode=max", "--metadata-file", str(metadata)]
    return [*argv, "--push", str(request.context)]


def stage(request: BuildRequest, staging_ref: str) -> str:
    """Build and push to `staging_ref` (docker buildx only); return `name@sha256:...`."""
    with tempfile.TemporaryDirectory(prefix="stage-") as folder:
        metadata = Path(folder) / "metadata.json"
        _run(stage_argv(request, staging_ref, metadata), request.variant)
        digest = json.loads(metadata.read_text())["containerimage.digest"]
    return f"{staging_ref.rsplit(':', 1)[0]}@{digest}"


def buildah_argv(request: BuildRequest, engine: str = "buildah") -> list[str]:
    """buildah bud (or podman build): chroot isolation runs in unprivileged containers too."""
    head = [
        engine,
        *(["--storage-driver", request.storage_driver] if request.storage_driver else []),
    ]
    argv = [*head, "bud" if engine == "buildah" else "build"]
    # docker format: the OCI format drops SHELL (and with it pipefail).
    argv += ["--format", "docker", "--isolation", "chroot", "--network", "host"]
    if request.registries:
        # buildah commits one layer over the base unless asked: a pushed image keeps one
        # layer per step, so a change to training/ ships the project's layer only.
        argv.append("--layers")
    argv += _common(request)
    if request.ca_bundle:
        argv += ["--volume", f"{request.ca_bundle}:{CA_BUNDLE_IN_BUILD}:ro"]
    if request.cache:
        argv += ["--cache-from", request.cache]
        if request.cache_write:
            argv += ["--cache-to", request.cache]
    return [*argv, str(request.context)]


def _head(engine: str, request: BuildRequest) -> list[str]:
    if engine == "docker":
        return ["docker"]
    driver = ["--storage-driver", request.storage_driver] if request.storage_driver else []
    return [engine, *driver]


def push_argvs(request: BuildRequest, engine: str, digest_dir: Path) -> list[list[str]]:
    """Tag the built local image with each registry name and push it: the bytes pushed are
    the ones tested. buildah/podman write each digest to digest_dir/<n>; docker's is read
    from the image's RepoDigests afterwards (see `pushed_digests`)."""
    head, argvs = _head(engine, request), []
    for index, tag in enumerate(request.tags):
        argvs.append([*head, "tag", request.local_tag, tag])
        digest_file = ["--digestfile", str(digest_dir / str(index))] if engine != "docker" else []
        argvs.append([*head, "push", *digest_file, tag])
    return argvs


def pushed_digests(request: BuildRequest, engine: str, digest_dir: Path) -> list[str]:
    """<registry>/<name>@sha256:... for each registry pushed to."""
    if engine != "docker":
        return [
            f"{tag.rsplit(':', 1)[0]}@{(digest_dir / str(index)).read_text().strip()}"
            for index, tag in enumerate(request.tags)
        ]
    template = "{{range .RepoDigests}}{{println .}}{{end}}"
    found = subprocess.run(
        ["docker", "image", "inspect", "--format", template, request.local_tag],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    names = {tag.rsplit(":", 1)[0] for tag in request.tags}
    return [digest for digest in found if digest.split("@", 1)[0] in names]


def detect_engine() -> str:
    """docker when a Docker engine answers, else buildah, else podman."""
    if shutil.which("docker"):
        probe = subprocess.run(["docker", "info"], capture_output=True, check=False)
        if probe.returncode == 0:
            return "docker"
    for engine in ("buildah", "podman"):
        if shutil.which(engine):
            return engine
    raise CannotRun(
        "no image builder: `docker info` fails and neither buildah nor podman is on PATH "
        "(Debian: apt-get install buildah)"
    )


def build_argv(request: BuildRequest, engine: str) -> list[str]:
    return docker_argv(request) if engine == "docker" else buildah_argv(request, engine)


def _run(argv: list[str], variant: Variant) -> None:
    print("+", shlex.join(argv), flush=True)
    if subprocess.run(argv, check=False).returncode != 0:
        raise RunFailed(f"{' '.join(argv[:3])}... failed for variant {variant.name!r}")


def build(request: BuildRequest, engine: str | None = None) -> str:
    """Build the image into the local store; return its local tag."""
    engine = engine or detect_engine()
    _run(build_argv(request, engine), request.variant)
    return request.local_tag


def push(request: BuildRequest, engine: str | None = None) -> list[str]:
    """Push the locally built image to every registry; return name@digest for each."""
    engine = engine or detect_engine()
    with tempfile.TemporaryDirectory(prefix="digests-") as digest_dir:
        for argv in push_argvs(request, engine, Path(digest_dir)):
            _run(argv, request.variant)
        return pushed_digests(request, engine, Path(digest_dir))
