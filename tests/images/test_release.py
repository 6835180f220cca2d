"""The release steps against a real registry: Distribution's registry (Debian package
docker-registry) on loopback, and skopeo, as the release job runs them.

The staged image is an index like the one BuildKit pushes with attestations: the image
manifest and an attestation manifest beside it. Expected digests are the sha256 of the
bytes written here, never a figure the code under test reports.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from images.__main__ import main
from images.matrix import load_matrix
from tests.images.registry import image_layout, push_layout, skopeo

MATRIX = load_matrix()
VARIANT = MATRIX.variant("cu130")
TAG = VARIANT.tag(MATRIX.release)


def stage(tmp_path: Path, registry: str) -> tuple[str, str, str]:
    """Push the layout as the staging job would; return staged name@digest, the index
    digest, and the attestation manifest's digest."""
    index, attestation = image_layout(tmp_path / "layout")
    digest = "sha256:" + hashlib.sha256(index).hexdigest()
    staging = f"{registry}/acme/gpu-training-stack-staging"
    push_layout(tmp_path / "layout", f"{staging}:{TAG}-run7")
    return f"{staging}@{digest}", digest, attestation


def images(*args: str) -> int:
    return main([*args, "--insecure-registry"])


def test_a_staged_image_is_promoted_byte_for_byte_with_its_attestations(tmp_path, registry, capsys):
    staged, digest, attestation = stage(tmp_path, registry)
    release = f"{registry}/acme/gpu-training-stack:{TAG}"
    assert images("release-check", "cu130", f"{registry}/acme") == 0
    assert capsys.readouterr().out.strip() == f"{release}: not yet released"

    assert images("promote", "cu130", f"{registry}/acme", staged) == 0
    assert capsys.readouterr().out.strip() == f"{release}@{digest}"
    served = skopeo("inspect", "--raw", "--tls-verify=false", f"docker://{release}").stdout
    assert "sha256:" + hashlib.sha256(served).hexdigest() == digest
    # The SBOM and provenance travel with it: the attestation manifest is in the release
    # repository, by its own digest.
    skopeo(
        "inspect", "--raw", "--tls-verify=false",
        f"docker://{registry}/acme/gpu-training-stack@{attestation}",
    )  # fmt: skip


def test_an_existing_release_tag_is_refused_and_left_as_it_was(tmp_path, registry, capsys):
    staged, digest, _ = stage(tmp_path, registry)
    assert images("promote", "cu130", f"{registry}/acme", staged) == 0
    capsys.readouterr()
    release = f"{registry}/acme/gpu-training-stack:{TAG}"

    assert images("release-check", "cu130", f"{registry}/acme") == 1
    refused = f"error: {release} already exists ({digest}): a release tag is pushed once"
    assert capsys.readouterr().err.startswith(refused)

    # A re-run of the release, from another staged image, moves nothing.
    other = f"{registry}/acme/gpu-training-stack-staging@sha256:" + "0" * 64
    assert images("promote", "cu130", f"{registry}/acme", other) == 1
    assert capsys.readouterr().err.startswith(refused)
    served = skopeo("inspect", "--raw", "--tls-verify=false", f"docker://{release}").stdout
    assert "sha256:" + hashlib.sha256(served).hexdigest() == digest


def test_a_digest_that_was_never_staged_cannot_be_promoted(registry, capsys):
    missing = f"{registry}/acme/gpu-training-stack-staging@sha256:" + "1" * 64
    assert images("promote", "cu130", f"{registry}/acme", missing) == 1
    assert "skopeo copy to" in capsys.readouterr().err
    assert images("release-check", "cu130", f"{registry}/acme") == 0  # nothing was tagged
