"""Mirror of committed checkpoints in S3 (``TRAIN_S3_URI=s3://bucket/prefix``).

Layout under the prefix, one folder per checkpoint tag plus a pointer:

    <prefix>/step_00000100/<every file of the local step folder>
    <prefix>/step_00000100/commit.json   uploaded after the tag's other files
    <prefix>/latest_committed            uploaded last: names the newest tag

A tag counts in S3 only once its ``commit.json`` exists, so an upload cut
short (spot termination, network) is never mistaken for a checkpoint.
boto3 finds credentials and the endpoint itself (instance role, or
``AWS_ENDPOINT_URL`` for a local S3 such as moto's server).
"""

from __future__ import annotations

import logging
import os
import shutil
import uuid
from pathlib import Path

import boto3
from botocore.exceptions import ClientError

from training.checkpoint import COMMIT_MARKER, POINTER_NAME, parse_step

log = logging.getLogger(__name__)

_DELETE_BATCH = 1000  # S3 DeleteObjects limit


class S3Mirror:
    def __init__(self, bucket: str, prefix: str, *, client=None):
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self._s3 = client if client is not None else boto3.client("s3")

    @classmethod
    def from_uri(cls, uri: str) -> S3Mirror:
        bucket, _, prefix = uri.removeprefix("s3://").partition("/")
        if not uri.startswith("s3://") or not bucket or "/" in bucket or not prefix.strip("/"):
            raise ValueError(
                f"TRAIN_S3_URI={uri!r} is not a checkpoint location: "
                "expected s3://BUCKET/PREFIX, e.g. s3://my-bucket/runs/gpt-demo"
            )
        return cls(bucket, prefix)

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"

    def _key(self, *parts: str) -> str:
        return "/".join((self.prefix, *parts))

    def upload(self, local_dir: Path, tag: str) -> None:
        """Upload a committed step folder: its files, then its marker, then the pointer."""
        marker = local_dir / COMMIT_MARKER
        if not marker.is_file():
            raise FileNotFoundError(f"{local_dir} has no {COMMIT_MARKER}: refusing to mirror it")
        files = sorted(p for p in local_dir.rglob("*") if p.is_file() and p != marker)
        for path in files:
            self._s3.upload_file(str(path), self.bucket, self._key(tag, _rel(path, local_dir)))
        self._s3.upload_file(str(marker), self.bucket, self._key(tag, COMMIT_MARKER))
        self._s3.put_object(Bucket=self.bucket, Key=self._key(POINTER_NAME), Body=tag.encode())
        log.info("mirrored %s to %s/%s (%d files)", local_dir, self.uri, tag, len(files) + 1)

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
        return self._exists(self._key(tag, COMMIT_MARKER))

    def latest_tag(self) -> str | None:
        """The tag the pointer names; the newest committed tag when the pointer is unusable.

        A tag uploaded after the pointer's (an upload cut short before its
        pointer write) is not returned while the pointer is valid.
        """
        pointed = self._read_pointer()
        if pointed is not None and self.is_committed(pointed):
            return pointed
        if pointed is not None:
            log.warning(
                "%s/%s names %r, which is not committed there", self.uri, POINTER_NAME, pointed
            )
        for tag in reversed(self.tags()):
            if self.is_committed(tag):
                return tag
        return None

    def download(self, tag: str, local_root: Path) -> Path:
        """Fetch a committed tag into ``local_root/tag``, replacing what was there.

        Files land in a temporary folder that is renamed into place only once
        every object, the marker last, has arrived.
        """
        if not self.is_committed(tag):
            raise FileNotFoundError(f"{self.uri}/{tag} has no {COMMIT_MARKER}")
        local_root.mkdir(parents=True, exist_ok=True)
        staging = local_root / f".download-{tag}-{uuid.uuid4().hex[:8]}"
        try:
            keys = self._list_keys(self._key(tag) + "/")
            marker_key = self._key(tag, COMMIT_MARKER)
            for key in [*sorted(k for k in keys if k != marker_key), marker_key]:
                target = staging / key[len(self._key(tag)) + 1 :]
                target.parent.mkdir(parents=True, exist_ok=True)
                self._s3.download_file(self.bucket, key, str(target))
            final = local_root / tag
            if final.exists():
                shutil.rmtree(final)
            os.replace(staging, final)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        log.info("downloaded %s/%s to %s (%d files)", self.uri, tag, final, len(keys))
        return final

    def delete(self, tag: str) -> None:
        """Remove a tag: its marker first, so a half-deleted tag is never committed."""
        self._s3.delete_object(Bucket=self.bucket, Key=self._key(tag, COMMIT_MARKER))
        keys = self._list_keys(self._key(tag) + "/")
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
            log.warning("%s/%s holds %r, not a step tag", self.uri, POINTER_NAME, text[:80])
            return None
        return text

    def _exists(self, key: str) -> bool:
        try:
            self._s3.head_object(Bucket=self.bucket, Key=key)
        except ClientError as exc:
            if _is_not_found(exc):
                return False
            raise
        return True

    def _list_keys(self, prefix: str) -> list[str]:
        pages = self._s3.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=prefix
        )
        return [obj["Key"] for page in pages for obj in page.get("Contents", [])]


def _rel(path: Path, root: Path) -> str:
    return path.relative_to(root).as_posix()


def _is_not_found(exc: ClientError) -> bool:
    return exc.response.get("Error", {}).get("Code") in {"404", "NoSuchKey", "NotFound"}
