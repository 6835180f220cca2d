"""Mirror of committed checkpoints in S3 (``TRAIN_S3_URI=s3://bucket/prefix``).

Layout under the prefix, one folder per checkpoint tag plus a pointer:

    <prefix>/step_00000100/<every file of the step folder>
    <prefix>/step_00000100/commit.json   uploaded after the tag's other files
    <prefix>/latest_committed            uploaded last: names the newest tag
    <prefix>/status.json                 the job's progress (rank 0, at most once a minute)

A tag counts in S3 once its ``commit.json`` exists and it is not newer than
the pointer, so an upload cut short (spot termination, network) is never
mistaken for a checkpoint. The pointer is only an upper bound: when it is
missing or unreadable, every tag with a marker counts. boto3 finds
credentials and the endpoint itself (instance role, or ``AWS_ENDPOINT_URL``
for a local S3 such as moto's server).
"""

from __future__ import annotations

import json
import logging
import re
import shutil
from pathlib import Path

import boto3
from botocore.exceptions import ClientError

from training.checkpoint.layout import (
    COMMIT_MARKER,
    POINTER_NAME,
    parse_manifest,
    parse_step,
    write_atomically,
)

log = logging.getLogger(__name__)

_DELETE_BATCH = 1000  # S3 DeleteObjects limit
# Beside the checkpoints, where `python -m infra status` reads the job's step, loss and speed.
STATUS_NAME = "status.json"

# Bucket names: 3-63 lowercase letters, digits, dots and hyphens, starting and ending
# with a letter or digit (https://docs.aws.amazon.com/AmazonS3/latest/userguide/bucketnamingrules.html).
_BUCKET_NAME = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


def parse_uri(uri: str) -> tuple[str, str]:
    """(bucket, prefix) of ``s3://BUCKET/PREFIX``; ValueError with the fix otherwise."""
    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    if not uri.startswith("s3://") or not bucket or not prefix.strip("/"):
        raise ValueError(
            f"TRAIN_S3_URI = {uri!r} is not a checkpoint location: "
            "expected s3://BUCKET/PREFIX, e.g. s3://my-bucket/runs/gpt-demo"
        )
    if not _BUCKET_NAME.match(bucket):
        raise ValueError(
            f"TRAIN_S3_URI = {uri!r}: {bucket!r} is not a valid S3 bucket name "
            "(3-63 lowercase letters, digits, dots and hyphens)"
        )
    return bucket, prefix


class S3Mirror:
    """The checkpoint store (training.checkpoint.store.CheckpointStore) in an S3 prefix."""

    def __init__(self, bucket: str, prefix: str, *, client=None):
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self._s3 = client if client is not None else boto3.client("s3")

    @classmethod
    def from_uri(cls, uri: str) -> S3Mirror:
        return cls(*parse_uri(uri))

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"

    def _key(self, *parts: str) -> str:
        return "/".join((self.prefix, *parts))

    # ---------------------------------------------------------------- upload

    def upload(self, local_dir: Path, tag: str) -> None:
        """Upload a committed step folder: its files, then its marker, then the pointer."""
        self.upload_files(local_dir, tag)
        self.commit(local_dir, tag)

    def upload_files(self, local_dir: Path, tag: str) -> int:
        """Upload every file of ``local_dir`` but its marker; returns how many.

        Nodes that each hold part of a checkpoint all call this, then one calls commit().
        """
        files = sorted(p for p in local_dir.rglob("*") if p.is_file() and p.name != COMMIT_MARKER)
        for path in files:
            key = self._key(tag, path.relative_to(local_dir).as_posix())
            self._s3.upload_file(str(path), self.bucket, key)
        return len(files)

    def commit(self, local_dir: Path, tag: str) -> None:
        """Upload the marker of a tag whose files are all uploaded, then the pointer."""
        marker = local_dir / COMMIT_MARKER
        if not marker.is_file():
            raise FileNotFoundError(f"{local_dir} has no {COMMIT_MARKER}: refusing to mirror it")
        self._s3.upload_file(str(marker), self.bucket, self._key(tag, COMMIT_MARKER))
        self._s3.put_object(Bucket=self.bucket, Key=self._key(POINTER_NAME), Body=tag.encode())
        log.info("mirrored %s to %s/%s", local_dir, self.uri, tag)

    def put_status(self, status: dict) -> None:
        """Replace the job's status object (one small PUT)."""
        self._s3.put_object(
            Bucket=self.bucket,
            Key=self._key(STATUS_NAME),
            Body=json.dumps(status).encode(),
            ContentType="application/json",
        )

    # --------------------------------------------------------------- listing

    def tags(self) -> list[str]:
        """Every step tag that has objects under the prefix, committed or not, oldest first."""
        found = set()
        pages = self._s3.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=self.prefix + "/", Delimiter="/"
        )
        for page in pages:
            for common in page.get("CommonPrefixes", []):
                name = common["Prefix"][len(self.prefix) + 1 :].rstrip("/")
                if parse_step(name) is not None:
                    found.add(name)
        return sorted(found, key=parse_step)

    def is_committed(self, tag: str) -> bool:
        try:
            self._s3.head_object(Bucket=self.bucket, Key=self._key(tag, COMMIT_MARKER))
        except ClientError as exc:
            if _is_not_found(exc):
                return False
            raise
        return True

    def committed_tags(self) -> list[str]:
        """Tags with a marker and no newer than the pointer, oldest first."""
        pointed = self._read_pointer()
        limit = parse_step(pointed) if pointed is not None else None
        return [
            tag
            for tag in self.tags()
            if (limit is None or parse_step(tag) <= limit) and self.is_committed(tag)
        ]

    def latest_tag(self) -> str | None:
        committed = self.committed_tags()
        return committed[-1] if committed else None

    def manifest(self, tag: str) -> dict:
        """The manifest of a committed tag, read from S3 (``layout.parse_manifest``)."""
        body = self._s3.get_object(Bucket=self.bucket, Key=self._key(tag, COMMIT_MARKER))["Body"]
        return parse_manifest(body.read())

    # -------------------------------------------------------------- download

    def download(self, tag: str, local_root: Path) -> Path:
        """Make ``local_root/tag`` a complete copy of a committed tag; returns the folder.

        A local folder holding part of the same checkpoint (same marker) keeps
        the files it already has with the right size; anything else there is
        replaced. The marker arrives last, so an interrupted download never
        leaves a folder that passes as complete.
        """
        marker_key = self._key(tag, COMMIT_MARKER)
        try:
            remote_marker = self._s3.get_object(Bucket=self.bucket, Key=marker_key)["Body"].read()
        except ClientError as exc:
            if _is_not_found(exc):
                raise FileNotFoundError(f"{self.uri}/{tag} has no {COMMIT_MARKER}") from None
            raise
        folder = local_root / tag
        local_marker = folder / COMMIT_MARKER
        if folder.exists() and not (
            local_marker.is_file() and _same_json(local_marker.read_bytes(), remote_marker)
        ):
            shutil.rmtree(folder)
        objects = {
            obj["Key"][len(self._key(tag)) + 1 :]: obj["Size"]
            for obj in self._list_objects(self._key(tag) + "/")
            if obj["Key"] != marker_key
        }
        if folder.exists():
            for path in folder.rglob("*"):
                name = path.relative_to(folder).as_posix()
                if path.is_file() and path.name != COMMIT_MARKER and name not in objects:
                    path.unlink()
        fetched = 0
        for name, size in sorted(objects.items()):
            target = folder / name
            if target.is_file() and target.stat().st_size == size:
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            self._s3.download_file(self.bucket, self._key(tag, name), str(target))
            fetched += 1
        folder.mkdir(parents=True, exist_ok=True)
        write_atomically(local_marker, remote_marker)
        log.info(
            "downloaded %s/%s to %s (%d of %d files fetched)",
            self.uri,
            tag,
            folder,
            fetched,
            len(objects),
        )
        return folder

    def delete(self, tag: str) -> None:
        """Remove a tag: its marker first, so a half-deleted tag is never committed."""
        self._s3.delete_object(Bucket=self.bucket, Key=self._key(tag, COMMIT_MARKER))
        keys = [obj["Key"] for obj in self._list_objects(self._key(tag) + "/")]
        for start in range(0, len(keys), _DELETE_BATCH):
            batch = [{"Key": k} for k in keys[start : start + _DELETE_BATCH]]
            self._s3.delete_objects(Bucket=self.bucket, Delete={"Objects": batch, "Quiet": True})

    def _read_pointer(self) -> str | None:
        try:
            body = self._s3.get_object(Bucket=self.bucket, Key=self._key(POINTER_NAME))["Body"]
        except ClientError as exc:
            if _is_not_found(exc):
                return None
            raise
        text = body.read().decode(errors="replace").strip()
        if parse_step(text) is None:
            log.warning("%s/%s holds %r, not a step tag: ignoring it", self.uri, POINTER_NAME, text)
            return None
        return text

    def _list_objects(self, prefix: str) -> list[dict]:
        paginator = self._s3.get_paginator("list_objects_v2")
        pages = paginator.paginate(Bucket=self.bucket, Prefix=prefix)
        return [obj for page in pages for obj in page.get("Contents", [])]


def _same_json(a: bytes, b: bytes) -> bool:
    try:
        return json.loads(a) == json.loads(b)
    except ValueError:
        return False


def _is_not_found(exc: ClientError) -> bool:
    return exc.response.get("Error", {}).get("Code") in {"404", "NoSuchKey", "NotFound"}
