"""A local registry and OCI images to push to it, for the release and base-digest tests.

The registry is Distribution's (Debian package docker-registry) on loopback; images are
OCI layouts written here byte by byte, so a test computes every digest itself.
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

from tests.support.tools import require_tool
from tests.training.multirank import free_port

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


def image_layout(layout: Path, marker: bytes = b"trainer\n") -> tuple[bytes, str]:
    """An OCI layout whose tag `staged` is an index of an image and its attestation
    manifest (as `docker buildx build --sbom=true --provenance=...` pushes); returns the
    index bytes and the attestation manifest's digest."""
    (layout / "blobs" / "sha256").mkdir(parents=True)
    (layout / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w") as tar:
        payload = marker
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


def push_layout(layout: Path, reference: str) -> None:
    """Push the layout's `staged` image (all of its index) to `reference`, bytes unchanged."""
    skopeo(
        "copy", "--all", "--preserve-digests", "--dest-tls-verify=false",
        f"oci:{layout}:staged", f"docker://{reference}",
    )  # fmt: skip
