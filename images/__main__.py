"""python -m images: build, lock and check the training images.

  python -m images build <variant> [--push REGISTRY ...] [--wheelhouse DIR [--offline]] ...
  python -m images push <variant> REGISTRY ...
  python -m images stage <variant> REGISTRY --run ID [--cache REF]
  python -m images release-check <variant> REGISTRY
  python -m images refresh-bases [--registry HOST]
  python -m images promote <variant> REGISTRY STAGED@sha256:...
  python -m images build-args <variant>
  python -m images bootstrap-base <variant> [--storage-driver vfs]
  python -m images lock <variant> [--find-links DIR]
  python -m images wheelhouse <variant> DIR [--find-links DIR]
  python -m images ci-matrix
  python -m images disk-budget <variant> [--path DIR ...]
  python -m images smoke <variant> [--storage-driver vfs] [--workdir DIR]

Bad input prints one line and exits 2; a failed build or smoke run exits 1.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from images import base, base_digests, builder, ci_matrix, disk_budget, locks, release, smoke
from images.build_args import build_args, commit_time, git_revision, source_url
from images.errors import CannotRun, RunFailed
from images.matrix import MatrixError, load_matrix


def _existing_dir(value: str) -> Path:
    path = Path(value)
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"{value!r} is not a directory")
    return path.resolve()


def _existing_file(value: str) -> Path:
    path = Path(value)
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"{value!r} is not a file")
    return path.resolve()


def _add_find_links(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "--find-links",
        type=_existing_dir,
        metavar="DIR",
        help="local wheels: a torch build that is not on PyPI (the cpu variant's), when "
        "its index is unreachable",
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m images", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)

    build = commands.add_parser("build", help="build one variant's image")
    build.add_argument("variant")
    build.add_argument(
        "--push",
        action="append",
        default=[],
        metavar="REGISTRY",
        help="push to REGISTRY/<image name>:<tag> (repeatable)",
    )
    build.add_argument(
        "--image-name",
        default=builder.IMAGE_NAME,
        help=f"repository name in each registry (default {builder.IMAGE_NAME}); for a stack's "
        "ECR repository, the part of its image_uri between the registry and the tag",
    )
    build.add_argument(
        "--wheelhouse",
        type=_existing_dir,
        metavar="DIR",
        help="wheels pip prefers over the indexes (torch then comes from here)",
    )
    build.add_argument(
        "--offline",
        action="store_true",
        help="no index at all: every package from --wheelhouse (see the wheelhouse command)",
    )
    build.add_argument(
        "--ca-bundle",
        type=_existing_file,
        metavar="FILE",
        help="CA bundle pip trusts inside a buildah build",
    )
    build.add_argument("--cache", metavar="REF", help="registry ref of the variant's layer cache")
    build.add_argument("--cache-write", action="store_true", help="also write --cache")
    build.add_argument(
        "--engine",
        choices=("docker", "buildah", "podman"),
        help="default: docker if `docker info` works, else buildah, else podman",
    )
    build.add_argument("--storage-driver", help="buildah/podman storage driver (e.g. vfs)")
    build.add_argument("--dry-run", action="store_true", help="print the commands only")

    push = commands.add_parser(
        "push", help="push the image `build` made (the one smoke tested), print its digests"
    )
    push.add_argument("variant")
    push.add_argument("registry", nargs="+", help="push to REGISTRY/<image name>:<tag>")
    push.add_argument("--image-name", default=builder.IMAGE_NAME, help="as for build")
    push.add_argument("--engine", choices=("docker", "buildah", "podman"), help="as for build")
    push.add_argument("--storage-driver", help="buildah/podman storage driver (e.g. vfs)")

    staging = commands.add_parser(
        "stage",
        help="build and push to REGISTRY/<image name>-staging:<tag>-<run> with an SBOM and "
        "provenance (docker buildx); print name@digest",
    )
    staging.add_argument("variant")
    staging.add_argument("registry")
    staging.add_argument("--run", required=True, help="this run's id (one staging tag per run)")
    staging.add_argument("--image-name", default=builder.IMAGE_NAME, help="as for build")
    staging.add_argument("--cache", metavar="REF", help="registry ref of the layer cache")
    staging.add_argument("--cache-write", action="store_true", help="also write --cache")

    for name, what in (
        ("release-check", "exit 1 if REGISTRY already holds the variant's release tag"),
        ("promote", "copy a staged image, by digest, to its release tag; print name:tag@digest"),
    ):
        command = commands.add_parser(name, help=what)
        command.add_argument("variant")
        command.add_argument("registry")
        if name == "promote":
            command.add_argument("staged", help="the staged image, NAME@sha256:...")
        command.add_argument("--image-name", default=builder.IMAGE_NAME, help="as for build")
        command.add_argument(
            "--insecure-registry",
            action="store_true",
            help="plain HTTP, no TLS check (a test registry on loopback only)",
        )

    args = commands.add_parser("build-args", help="print the variant's build args")
    args.add_argument("variant")

    bootstrap = commands.add_parser("bootstrap-base", help="debootstrap the variant's Debian base")
    bootstrap.add_argument("variant")
    bootstrap.add_argument("--storage-driver", help="buildah storage driver (e.g. vfs)")

    lock = commands.add_parser("lock", help="regenerate images/locks/<variant>.txt")
    lock.add_argument("variant")
    _add_find_links(lock)

    house = commands.add_parser("wheelhouse", help="download a lock's files for offline builds")
    house.add_argument("variant")
    house.add_argument("dest", type=Path, help="folder to fill (made if missing)")
    _add_find_links(house)

    commands.add_parser("ci-matrix", help="print the CI build matrix as JSON (one line)")

    refresh = commands.add_parser(
        "refresh-bases", help="re-read each CUDA base tag's digest; rewrite matrix.toml"
    )
    refresh.add_argument(
        "--registry", default="docker.io", help="where the bases are read (a mirror of Docker Hub)"
    )
    refresh.add_argument(
        "--insecure-registry", action="store_true", help="plain HTTP (a test registry only)"
    )

    disk = commands.add_parser(
        "disk-budget", help="disk the build needs (from registry and PyPI sizes) vs free"
    )
    disk.add_argument("variant")
    disk.add_argument(
        "--path",
        type=Path,
        action="append",
        default=[],
        help="where the build writes (the first that exists is checked; default /)",
    )
    disk.add_argument(
        "--cache-write", action="store_true", help="count the mode=max registry cache export"
    )
    disk.add_argument(
        "--peak-log",
        type=_existing_file,
        metavar="FILE",
        help="bytes used on --path, sampled during the build (`df -B1 --output=used`, first "
        "sample before it): print the measured peak and fail when it exceeds the budget",
    )

    run = commands.add_parser("smoke", help="build-and-run check of an image (buildah)")
    run.add_argument("variant")
    run.add_argument("--storage-driver", help="buildah storage driver (e.g. vfs)")
    run.add_argument(
        "--workdir",
        type=Path,
        default=Path("build/smoke"),
        help="host folder for the run's checkpoints and metrics",
    )
    return parser


def _run(options: argparse.Namespace) -> int:
    matrix = load_matrix()
    if options.command == "ci-matrix":
        print(ci_matrix.render(matrix))
        return 0
    if options.command == "refresh-bases":
        registry = release.Registry(tls_verify=not options.insecure_registry)
        changes = base_digests.main(matrix, options.registry, registry)
        print("\n".join(changes) or "every CUDA base digest is current")
        return 0
    variant = matrix.variant(options.variant)
    if options.command == "build-args":
        values = build_args(
            matrix,
            variant,
            revision=git_revision(),
            created=commit_time(),
            source_url=source_url(),
        )
        print("\n".join(f"{key}={value}" for key, value in values.items()))
    elif options.command == "bootstrap-base":
        print("\n".join(base.bootstrap_base(variant, options.storage_driver)))
    elif options.command == "lock":
        path = locks.lock_path(variant)
        text = locks.make_lock(matrix, variant, options.find_links)
        path.write_text(text)
        print(path)
    elif options.command == "wheelhouse":
        locks.fill_wheelhouse(matrix, variant, options.dest.resolve(), options.find_links)
        print(options.dest)
    elif options.command in ("build", "push"):
        registries = options.push if options.command == "build" else options.registry
        request = builder.make_request(
            matrix,
            variant,
            revision=git_revision(),
            created=commit_time(),
            source_url=source_url(),
            registries=tuple(registries),
            wheelhouse=getattr(options, "wheelhouse", None),
            offline=getattr(options, "offline", False),
            ca_bundle=getattr(options, "ca_bundle", None),
            cache=getattr(options, "cache", None),
            cache_write=getattr(options, "cache_write", False),
            storage_driver=options.storage_driver,
            image_name=options.image_name,
        )
        engine = options.engine or builder.detect_engine()
        if getattr(options, "dry_run", False):
            argvs = [builder.build_argv(request, engine)]
            argvs += builder.push_argvs(request, engine, Path("DIGESTS"))
            print("\n".join(map(shlex.join, argvs)))
            return 0
        if options.command == "build":
            print(builder.build(request, engine))
        if request.registries:
            print("\n".join(builder.push(request, engine)))
    elif options.command == "stage":
        request = builder.make_request(
            matrix,
            variant,
            revision=git_revision(),
            created=commit_time(),
            source_url=source_url(),
            cache=options.cache,
            cache_write=options.cache_write,
            image_name=options.image_name,
        )
        repository = release.staging_repository(
            f"{options.registry.rstrip('/')}/{options.image_name}"
        )
        tag = release.staging_tag(variant.tag(matrix.release), options.run)
        print(builder.stage(request, f"{repository}:{tag}"))
    elif options.command in ("release-check", "promote"):
        target = (
            f"{options.registry.rstrip('/')}/{options.image_name}:{variant.tag(matrix.release)}"
        )
        registry = release.Registry(tls_verify=not options.insecure_registry)
        if options.command == "release-check":
            release.check_absent(target, registry)
            print(f"{target}: not yet released")
        else:
            print(release.promote(options.staged, target, registry))
    elif options.command == "disk-budget":
        return disk_budget.main(
            matrix,
            variant,
            options.path,
            cache_write=options.cache_write,
            peak_log=options.peak_log,
        )
    elif options.command == "smoke":
        smoke.main(matrix, variant, options.storage_driver, options.workdir)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    options = parser.parse_args(argv)
    if options.command in ("build", "stage") and options.cache_write and not options.cache:
        parser.error("--cache-write needs --cache REF (the registry ref to write the cache to)")
    try:
        return _run(options)
    except (MatrixError, CannotRun, locks.LockError, LookupError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except (RunFailed, smoke.SmokeError, release.ReleaseRefused) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
