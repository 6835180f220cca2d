"""A command job's CHECKPOINT_DIR in moto's S3: a fresh node gets the last whole copy, an
unchanged file is not uploaded again, a stale node is brought up to date, the node that
saved last keeps its own, and neither a cut upload nor a damaged object passes as a copy."""

from __future__ import annotations

from pathlib import Path

import boto3
import pytest
import xxhash

from training.checkpoint.folder_mirror import FolderMirror, MirrorError
from training.checkpoint.s3 import parse_uri


def folder_files(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()
    }


def node(tmp_path: Path, name: str, s3_uri: str, rank: int = 0) -> FolderMirror:
    """The mirror of CHECKPOINT_DIR on a node whose disk is tmp_path/name."""
    folder = tmp_path / name / "ckpt"
    folder.mkdir(parents=True, exist_ok=True)
    return FolderMirror(boto3.client("s3"), s3_uri, folder, rank)


def blobs(s3_uri: str) -> list[str]:
    bucket, prefix = parse_uri(s3_uri)
    listed = boto3.client("s3").list_objects_v2(Bucket=bucket, Prefix=prefix)
    return sorted(o["Key"] for o in listed.get("Contents", []) if "/blobs/" in o["Key"])


def test_a_fresh_node_gets_the_copy_and_unchanged_files_are_not_uploaded_again(tmp_path, s3_uri):
    first = node(tmp_path, "a", s3_uri)
    (first.folder / "model").mkdir()
    (first.folder / "model" / "weights.bin").write_bytes(b"w" * 5000)
    (first.folder / "state.json").write_text('{"step": 3}')
    pushed = first.push()
    assert (pushed.files, pushed.uploaded, pushed.uploaded_bytes) == (2, 2, 5011)

    (first.folder / "state.json").write_text('{"step": 4}')
    pushed = first.push()
    assert (pushed.files, pushed.uploaded, pushed.uploaded_bytes) == (2, 1, 11)
    # Blobs are named by content: the old state's is gone, the weights' kept.
    expected = sorted(
        f"{parse_uri(s3_uri)[1]}/checkpoint-dir/node-0/blobs/{xxhash.xxh3_64_hexdigest(b)}-{len(b)}"
        for b in (b"w" * 5000, b'{"step": 4}')
    )
    assert blobs(s3_uri) == expected

    fresh = node(tmp_path, "b", s3_uri)
    assert fresh.pull() == 2
    assert folder_files(fresh.folder) == folder_files(first.folder)
    assert fresh.pull() is None  # now as new as S3's: nothing comes down again


def test_a_stale_node_takes_the_newer_copy_and_the_last_saver_keeps_its_own(tmp_path, s3_uri):
    a, b = node(tmp_path, "a", s3_uri), node(tmp_path, "b", s3_uri)
    (a.folder / "state.json").write_text('{"step": 3}')
    (a.folder / "old.pt").write_bytes(b"old")
    a.push()
    assert b.pull() == 2
    (b.folder / "old.pt").unlink()
    (b.folder / "state.json").write_text('{"step": 9}')
    b.push()  # the job ran on b and saved there last
    assert a.pull() == 1  # back on a: its copy is older, S3's wins, whole
    assert folder_files(a.folder) == {"state.json": b'{"step": 9}'}

    # A node whose upload failed after it saved holds the newest copy: it stays as it is.
    (a.folder / "state.json").write_text('{"step": 12}')
    assert a.pull() is None
    assert (a.folder / "state.json").read_text() == '{"step": 12}'


class _ManifestFails:
    """An S3 client whose upload is cut before the manifest (the grace period ran out)."""

    def __init__(self, s3):
        self._s3 = s3

    def __getattr__(self, name):
        return getattr(self._s3, name)

    def put_object(self, **kwargs):
        raise OSError("cut short")


def test_a_cut_upload_leaves_the_last_whole_copy_and_a_damaged_blob_is_refused(tmp_path, s3_uri):
    a = node(tmp_path, "a", s3_uri)
    (a.folder / "state.json").write_text('{"step": 3}')
    a.push()
    (a.folder / "state.json").write_text('{"step": 4}')
    cut = FolderMirror(_ManifestFails(boto3.client("s3")), s3_uri, a.folder, 0)
    with pytest.raises(OSError, match="cut short"):
        cut.push()
    fresh = node(tmp_path, "b", s3_uri)
    assert fresh.pull() == 1
    assert (fresh.folder / "state.json").read_text() == '{"step": 3}'

    bucket, _ = parse_uri(s3_uri)
    step_3 = next(key for key in blobs(s3_uri) if key.endswith("-11"))
    boto3.client("s3").put_object(Bucket=bucket, Key=step_3, Body=b'{"step": 7}')
    other = node(tmp_path, "c", s3_uri)
    with pytest.raises(MirrorError, match=r"state\.json differs from its manifest"):
        other.pull()
    assert folder_files(other.folder) == {}  # nothing half-written


def test_each_node_keeps_a_copy_of_its_own(tmp_path, s3_uri):
    zero, one = node(tmp_path, "a", s3_uri, rank=0), node(tmp_path, "b", s3_uri, rank=1)
    (zero.folder / "shard").write_bytes(b"zero")
    (one.folder / "shard").write_bytes(b"one")
    zero.push()
    one.push()
    assert node(tmp_path, "c", s3_uri, rank=1).pull() == 1
    assert (tmp_path / "c" / "ckpt" / "shard").read_bytes() == b"one"
