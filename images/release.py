"""Releasing an image: pushed once to a staging tag, smoke-tested by digest, then promoted.

A release tag names one image forever: it is never pushed twice (`check_absent` refuses a
tag the registry already holds) and never rebuilt. The staged image (pushed by `python -m
images build --stage`, with its SBOM and provenance attached by BuildKit) is pulled and
smoke-tested by digest; `promote` then copies exactly those bytes, the attestations
included, under the release tag, and refuses a result whose digest differs.

Registry work goes through skopeo (Debian/Ubuntu package `skopeo`; GitHub's Ubuntu runners
carry it), which reads the credentials `docker login` wrote (containers-auth.json(5): it
falls back to $HOME/.docker/config.json). Argument lists come from pure functions; the
tests run them against a local registry.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
from dataclasses import dataclass

from images.errors import CannotRun, RunFailed

# The repository staged images are pushed to, beside the release repository: users never
# see a staging tag among the release tags.
STAGING_SUFFIX = "-staging"
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
# What registries answer for a tag they do not hold (OCI distribution spec, error code
# MANIFEST_UNKNOWN; Docker Hub and GHCR word it "manifest unknown").
_ABSENT = re.compile(r"manifest unknown|MANIFEST_UNKNOWN|not found", re.IGNORECASE)


class ReleaseRefused(RuntimeError):
    """The release cannot go ahead (the tag exists, a digest differs); one line says why."""


@dataclass(frozen=True)
class Registry:
    """How skopeo reaches a registry: TLS checked, except for a test's registry on loopback."""

    tls_verify: bool = True

    def skopeo(self, command: str, *args: str) -> list[str]:
        flags = {
            "inspect": ["--tls-verify=false"],
            "copy": ["--src-tls-verify=false", "--dest-tls-verify=false"],
        }
        return ["skopeo", command, *([] if self.tls_verify else flags[command]), *args]


def staging_repository(repository: str) -> str:
    """ghcr.io/acme/gpu-training-stack -> ghcr.io/acme/gpu-training-stack-staging."""
    return repository + STAGING_SUFFIX


def staging_tag(tag: str, run: str) -> str:
    """One staging tag per CI run, so a re-run never overwrites what another run tested."""
    return f"{tag}-{run}"


def digest_of(manifest: bytes) -> str:
    """A manifest's digest: the sha256 of its bytes as the registry serves them."""
    return "sha256:" + hashlib.sha256(manifest).hexdigest()


def check_digest(reference: str) -> tuple[str, str]:
    """Split `name@sha256:...`; anything else is refused (a tag can move, a digest cannot)."""
    name, _, digest = reference.partition("@")
    if not _DIGEST.fullmatch(digest):
        raise CannotRun(f"{reference!r} is not NAME@sha256:<64 hex digits>: stage by digest")
    return name, digest


def _run(argv: list[str]) -> subprocess.CompletedProcess:
    if shutil.which(argv[0]) is None:
        raise CannotRun(f"{argv[0]} is not on PATH (Debian/Ubuntu: apt-get install {argv[0]})")
    return subprocess.run(argv, capture_output=True, check=False)


def raw_manifest(reference: str, registry: Registry) -> bytes | None:
    """The manifest (or index) bytes the registry serves for `reference`; None if absent."""
    result = _run(registry.skopeo("inspect", "--raw", f"docker://{reference}"))
    if result.returncode == 0:
        return result.stdout
    error = result.stderr.decode(errors="replace").strip()
    if _ABSENT.search(error):
        return None
    raise RunFailed(f"cannot read {reference}: {error.splitlines()[-1] if error else 'no output'}")


def check_absent(reference: str, registry: Registry) -> None:
    """Refuse a release tag the registry already holds: tags are never moved."""
    manifest = raw_manifest(reference, registry)
    if manifest is not None:
        raise ReleaseRefused(
            f"{reference} already exists ({digest_of(manifest)}): a release tag is pushed "
            "once; raise `release` in images/matrix.toml for a new one"
        )


def promote(staged: str, release: str, registry: Registry) -> str:
    """Copy the staged image (by digest) to the release tag, byte for byte; return
    `release@digest`. Refuses an existing release tag and a copy whose digest differs."""
    _, digest = check_digest(staged)
    check_absent(release, registry)
    argv = registry.skopeo(
        "copy", "--all", "--preserve-digests", f"docker://{staged}", f"docker://{release}"
    )
    result = _run(argv)
    if result.returncode != 0:
        error = result.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
        raise RunFailed(f"skopeo copy to {release} failed: {error[0]}")
    copied = raw_manifest(release, registry)
    if copied is None or digest_of(copied) != digest:
        found = digest_of(copied) if copied is not None else "nothing"
        raise ReleaseRefused(f"{release} holds {found} after the copy, not the staged {digest}")
    return f"{release}@{digest}"
