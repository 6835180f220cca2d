"""What the Checkpointer needs from a remote copy of the checkpoint root, whatever holds it.

Retention and the choice of the checkpoint to resume from are written against
this Protocol only; ``training.checkpoint.s3.S3Mirror`` is the implementation
the stack uses (torchtitan's checkpointer keeps storage apart the same way).
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol, runtime_checkable


@runtime_checkable
class CheckpointStore(Protocol):
    """A remote copy of committed step folders, laid out as ``training.checkpoint.layout``."""

    @property
    def uri(self) -> str:
        """Where the store is, for messages."""
        ...

    def upload_files(self, local_dir: Path, tag: str) -> int:
        """Copy every file of ``local_dir`` but its manifest; returns how many."""
        ...

    def commit(self, local_dir: Path, tag: str) -> None:
        """Copy the manifest of a tag whose files are all copied, then the pointer."""
        ...

    def put_status(self, status: dict) -> None:
        """Replace the job's progress report (read by ``python -m infra status``)."""
        ...

    def tags(self) -> list[str]:
        """Every step tag present, committed or not, oldest first."""
        ...

    def committed_tags(self) -> list[str]:
        """Tags whose manifest was copied (and not newer than the pointer), oldest first."""
        ...

    def manifest(self, tag: str) -> dict:
        """The parsed manifest of a committed tag (``layout.parse_manifest``)."""
        ...

    def download(self, tag: str, local_root: Path) -> Path:
        """Make ``local_root/tag`` a copy of a committed tag, manifest last; returns it."""
        ...

    def delete(self, tag: str) -> None:
        """Remove a tag, its manifest first."""
        ...


def prune(store: CheckpointStore, keep_last: int) -> list[str]:
    """Delete every tag but the newest ``keep_last`` committed ones; returns those deleted."""
    keep = set(store.committed_tags()[-keep_last:])
    deleted = [tag for tag in store.tags() if tag not in keep]
    for tag in deleted:
        store.delete(tag)
    return deleted
