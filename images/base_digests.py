"""`python -m images refresh-bases`: re-read each CUDA base tag's digest and rewrite
matrix.toml where it moved.

NVIDIA re-pushes a tag (security updates) and deletes it six months after it is
superseded; the matrix pins `<tag>@sha256:<digest>` so a build never takes a base nobody
reviewed. This reads the digest the registry now serves for each tag (the sha256 of the
manifest or index bytes, through skopeo as the release steps read theirs) and edits only
the digests in the file's text, so its comments and layout stay; CI's refresh-bases job
proposes the result as a pull request.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from images.matrix import MATRIX_PATH, Matrix
from images.release import Registry, digest_of, raw_manifest

_PINNED = re.compile(r"(nvidia/cuda:[\w.-]+)@(sha256:[0-9a-f]{64})")


def pinned_bases(matrix: Matrix) -> dict[str, str]:
    """tag -> pinned digest, for every CUDA base of every variant."""
    bases = {}
    for variant in matrix.variants:
        for image in (variant.base_build, variant.base_runtime):
            found = _PINNED.fullmatch(image)
            if found:
                bases[found[1]] = found[2]
    return bases


def refresh(text: str, current: dict[str, str]) -> tuple[str, list[str]]:
    """`text` with each pinned tag's digest replaced by `current[tag]`; the changes made."""
    changes = []

    def replace(found: re.Match) -> str:
        tag, old = found[1], found[2]
        new = current.get(tag, old)
        if new != old:
            changes.append(f"{tag}: {old} -> {new}")
        return f"{tag}@{new}"

    return _PINNED.sub(replace, text), changes


def registry_digest(tag: str, host: str, registry: Registry) -> str:
    """The digest `host` serves for `tag` now (Docker Hub's names are docker.io/<name>)."""
    manifest = raw_manifest(f"{host}/{tag}", registry)
    if manifest is None:
        raise LookupError(f"{host}/{tag} no longer exists: move the variant to a current tag")
    return digest_of(manifest)


def main(
    matrix: Matrix,
    host: str = "docker.io",
    registry: Registry | None = None,
    path: Path = MATRIX_PATH,
    read: Callable[[str, str, Registry], str] = registry_digest,
) -> list[str]:
    """Rewrite `path` with the current digests; return the changes (empty: all current)."""
    registry = registry or Registry()
    current = {tag: read(tag, host, registry) for tag in pinned_bases(matrix)}
    text, changes = refresh(path.read_text(), current)
    if changes:
        path.write_text(text)
    return changes
