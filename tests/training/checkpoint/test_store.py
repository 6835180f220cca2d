"""The CheckpointStore Protocol declares every call made on a store, and S3Mirror has them."""

from __future__ import annotations

import inspect

from training.checkpoint.s3 import S3Mirror
from training.checkpoint.store import CheckpointStore

# Every call the checkpointer and the trainer make on their mirror, written out here so
# that a call dropped from the Protocol fails this test.
CALLS = {
    "uri",
    "upload_files",
    "commit",
    "put_status",
    "tags",
    "committed_tags",
    "manifest",
    "download",
    "delete",
}


def _members(cls) -> set[str]:
    return {name for name in vars(cls) if not name.startswith("_")}


def test_the_protocol_declares_every_call_made_on_a_store():
    assert _members(CheckpointStore) == CALLS


def test_the_s3_mirror_implements_every_member_with_the_same_parameters():
    mirror = S3Mirror("bucket", "prefix", client=object())
    assert isinstance(mirror, CheckpointStore)
    for name in CALLS:
        declared = inspect.getattr_static(CheckpointStore, name)
        implemented = inspect.getattr_static(S3Mirror, name)
        if isinstance(declared, property):
            assert isinstance(implemented, property), name
            continue
        assert list(inspect.signature(implemented).parameters) == list(
            inspect.signature(declared).parameters
        ), name
