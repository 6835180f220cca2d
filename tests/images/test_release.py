"""The release steps against a real registry: Distribution's registry (Debian package
docker-registry) on loopback, and skopeo, as the release job runs them.

The staged image is an index like the one BuildKit pushes with attestations: the image
manifest and an attestation manifest beside it. Expected digests are the sha256 of the
bytes written here, never a figure the code under test reports.
"""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import tarfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from images.__main__ import main
from images.matrix import load_matrix
from tests.support.tools import require_tool
from tests.training.multirank import free_port

MATRIX = load_matrix()
VARIANT = MATRIX.variant("cu130")
TAG = VARIANT.tag(MATRIX.release)
OCI = "application/vnd.oci.image"


@pytest.fixture
def registry(tmp_path):
    """host:port of a registry that serves until the test ends."""
    binary = require_tool("docker-registry", "docker-registry")
    require_tool("skopeo", "skopeo")
    address = f"127.0.0.1:{free_port()}"
    config = tmp_path / "registry.yml"
    config.write_text(
        "version: 0.1\nlog:\n  level: error\n"
        f"storage:\n  filesystem:\n    rootdirectory: {tmp_path / 'data'}\n"
        f"http:\n  addr: {address}\n"
    )
    server = subprocess.Popen(
        [binary, "serve", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                urllib.request.urlopen(f"http://{address}/v2/", timeout=1).close()
                break
            except (urllib.error.URLError, ConnectionError):
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"registry did not start: {server.stderr.read()!r}"
                    ) from None
                time.sleep(0.1)
        yield address
    finally:
        server.terminate()
        server.wait(timeout=10)


def _blob(layout: Path, data: bytes) -> dict:
    digest = hashlib.sha256(data).hexdigest()
    (layout / "blobs" / "sha256" / digest).write_bytes(data)
    return {"digest": f"sha256:{digest}", "size": len(data)}


def _json(value: dict) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def image_layout(layout: Path) -> tuple[bytes, str]:
    """An OCI layout whose tag `staged` is an index of an image and its attestation
    manifest (as `docker buildx build --sbom=true --provenance=...` pushes); returns the
    index bytes and the attestation manifest's digest."""
    (layout / "blobs" / "sha256").mkdir(parents=True)
    (layout / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w") as tar:
        payload = b"trainer\n"
        info = tarfile.TarInfo("etc/marker")
        info.size = len(payload)
        tar.addfile(info, io.BytesIO(payload))
    layer = _blob(layout, archive.getvalue())
    config = _blob(
        layout,
        _json(
            {
                "architecture": "amd64",
                "os": "linux",
                "rootfs": {"type": "layers", "diff_ids": [layer["digest"]]},
            }
        ),
    )
    image = _blob(
        layout,
        _json(
            {
                "schemaVersion": 2,
                "mediaType": f"{OCI}.manifest.v1+json",
                "config": {"mediaType": f"{OCI}.config.v1+json", **config},
                "layers": [{"mediaType": f"{OCI}.layer.v1.tar", **layer}],
            }
        ),
    )
    statement = _blob(layout, _json({"_type": "https://in-toto.io/Statement/v0.1"}))
    attestation = _blob(
        layout,
        _json(
            {
                "schemaVersion": 2,
                "mediaType": f"{OCI}.manifest.v1+json",
                "config": {"mediaType": f"{OCI}.config.v1+json", **config},
                "layers": [{"mediaType": "application/vnd.in-toto+json", **statement}],
            }
        ),
    )
    index = _json(
        {
            "schemaVersion": 2,
            "mediaType": f"{OCI}.index.v1+json",
            "manifests": [
                {
                    "mediaType": f"{OCI}.manifest.v1+json",
                    **image,
                    "platform": {"architecture": "amd64", "os": "linux"},
                },
                {
                    "mediaType": f"{OCI}.manifest.v1+json",
                    **attestation,
                    "platform": {"architecture": "unknown", "os": "unknown"},
                    "annotations": {
                        "vnd.docker.reference.type": "attestation-manifest",
                        "vnd.docker.reference.digest": image["digest"],
                    },
                },
            ],
        }
    )
    entry = _blob(layout, index)
    (layout / "index.json").write_bytes(
        _json(
            {
                "schemaVersion": 2,
                "manifests": [
                    {
                        "mediaType": f"{OCI}.index.v1+json",
                        **entry,
                        "annotations": {"org.opencontainers.image.ref.name": "staged"},
                    }
                ],
            }
        )
    )
    return index, attestation["digest"]


def skopeo(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["skopeo", *args], capture_output=True, check=True, timeout=60)


def stage(tmp_path: Path, registry: str) -> tuple[str, str, str]:
    """Push the layout as the staging job would; return staged name@digest, the index
    digest, and the attestation manifest's digest."""
    index, attestation = image_layout(tmp_path / "layout")
    digest = "sha256:" + hashlib.sha256(index).hexdigest()
    staging = f"{registry}/acme/gpu-training-stack-staging"
    skopeo(
        "copy", "--all", "--preserve-digests", "--dest-tls-verify=false",
        f"oci:{tmp_path / 'layout'}:staged", f"docker://{staging}:{TAG}-run7",
    )  # fmt: skip
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
