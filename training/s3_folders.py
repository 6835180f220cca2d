"""Whole folders to and from an S3 prefix: a model's files (model.hf = "s3://..."), and
the tokenized data cache beside a run's checkpoints.

A folder is only ever seen whole. Downloads land in a staging folder beside the target
and are renamed into place; uploads put every file first and `marker` last, so a reader
that finds the marker finds every file. boto3 finds credentials and the endpoint itself
(the instance role, or AWS_ENDPOINT_URL for a local S3 such as moto's server).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import boto3
from botocore.exceptions import ClientError


def split_uri(uri: str) -> tuple[str, str]:
    """(bucket, prefix without slashes at its ends) of s3://bucket/prefix."""
    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    return bucket, prefix.strip("/")


def list_objects(uri: str, client=None) -> list[dict]:
    """Every object under the prefix (a folder's contents: the prefix ends at a '/'), as
    list_objects_v2 gives them (Key, Size, ETag), sorted by key."""
    client = client or boto3.client("s3")
    bucket, prefix = split_uri(uri)
    start = f"{prefix}/" if prefix else ""
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=start)
    objects = [item for page in pages for item in page.get("Contents", [])]
    return sorted((o for o in objects if not o["Key"].endswith("/")), key=lambda o: o["Key"])


def exists(uri: str, client=None) -> bool:
    """Whether the object at `uri` exists."""
    client = client or boto3.client("s3")
    bucket, key = split_uri(uri)
    try:
        client.head_object(Bucket=bucket, Key=key)
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
            return False
        raise
    return True


def download_object(uri: str, path: Path) -> None:
    bucket, key = split_uri(uri)
    boto3.client("s3").download_file(bucket, key, str(path))


def download_folder(
    uri: str,
    target: Path,
    *,
    objects: list[dict] | None = None,
    record: tuple[str, str] | None = None,
    replace: bool = False,
) -> None:
    """Copy every object under `uri` into `target` (made whole, then renamed into place).

    `record`: (file name, text) written into the folder with the objects; `replace`: an
    existing `target` is swapped for the new copy (else the one there is kept)."""
    client = boto3.client("s3")
    bucket, prefix = split_uri(uri)
    objects = list_objects(uri, client) if objects is None else objects
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        for item in objects:
            relative = item["Key"][len(prefix) + 1 :] if prefix else item["Key"]
            local = staging / relative
            local.parent.mkdir(parents=True, exist_ok=True)
            client.download_file(bucket, item["Key"], str(local))
        if record is not None:
            (staging / record[0]).write_text(record[1])
        if target.exists():
            if not replace:  # another process of this node got there first: keep its copy
                return
            old = Path(tempfile.mkdtemp(prefix=f".{target.name}-old-", dir=target.parent))
            target.rename(old / target.name)
            staging.rename(target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def upload_folder(folder: Path, uri: str, *, marker: str) -> None:
    """Put every file of `folder` under `uri`, the file named `marker` last."""
    client = boto3.client("s3")
    bucket, prefix = split_uri(uri)
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    last = [p for p in files if p.name == marker]
    for path in [p for p in files if p.name != marker] + last:
        key = "/".join(filter(None, (prefix, *path.relative_to(folder).parts)))
        client.upload_file(str(path), bucket, key)
