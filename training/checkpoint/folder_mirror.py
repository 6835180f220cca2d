"""A command job's CHECKPOINT_DIR mirrored to S3, so its saves outlive the node.

The trainer mirrors each committed checkpoint itself (training/checkpoint/s3.py); a command
job (training/command_job.py) saves files the stack knows nothing about, so `exec` copies
the whole folder: up after the command ends (a stop, a crash, the end), down before it
starts on a node that does not hold the newest copy (a Slurm requeue onto another node, a
replaced spot node). Each node of the job has a copy of its own, as its folder is on its
own disk. Layout under the job's TRAIN_S3_URI:

    <uri>/checkpoint-dir/node-<rank>/blobs/<xxh3_64>-<size>   one object per distinct file
    <uri>/checkpoint-dir/node-<rank>/manifest.json            written last: path -> blob

The manifest is written after every blob it names, so an upload cut short (the grace
period ran out) leaves the last whole copy in place; blobs are named by their content, so
an unchanged file is not uploaded again. Which copy is newer, the node's or S3's, is told
by the generation each manifest carries: the node records the generation it last
uploaded or downloaded beside its folder (`<folder>.mirror-node-<rank>.json`); when it is
S3's, the node's folder is at least as new and stays.
"""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from botocore.exceptions import ClientError

from training.checkpoint.layout import CHECKSUM, file_checksum, write_atomically

FOLDER_PREFIX = "checkpoint-dir"
MANIFEST_NAME = "manifest.json"
_PARTIAL = ".mirror-partial"  # a download in progress: never part of the folder


class MirrorError(RuntimeError):
    """The copy in S3 cannot be used (a blob differs from its manifest)."""


@dataclass(frozen=True)
class Pushed:
    files: int
    uploaded: int  # files whose content S3 did not hold yet
    uploaded_bytes: int


class FolderMirror:
    """Node `node_rank`'s copy of `folder` under `s3_uri` (the job's TRAIN_S3_URI)."""

    def __init__(self, s3: Any, s3_uri: str, folder: Path, node_rank: int) -> None:
        from training.checkpoint.s3 import parse_uri

        self._s3 = s3
        self.folder = folder
        self.bucket, prefix = parse_uri(s3_uri)
        self.prefix = f"{prefix.strip('/')}/{FOLDER_PREFIX}/node-{node_rank}"
        self.record = folder.with_name(f"{folder.name}.mirror-node-{node_rank}.json")

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"

    def push(self) -> Pushed:
        """Upload the folder as it is now: new blobs, then the manifest, then old blobs go."""
        files = {
            path.relative_to(self.folder).as_posix(): {
                "size": path.stat().st_size,
                CHECKSUM: file_checksum(path),
            }
            for path in sorted(self.folder.rglob("*"))
            if path.is_file() and not path.is_symlink() and not path.name.endswith(_PARTIAL)
        }
        held = set(self._blob_keys())
        uploaded = uploaded_bytes = 0
        for name, entry in files.items():
            key = self._blob_key(entry)
            if key not in held:
                self._s3.upload_file(str(self.folder / name), self.bucket, key)
                held.add(key)
                uploaded, uploaded_bytes = uploaded + 1, uploaded_bytes + entry["size"]
        generation = uuid.uuid4().hex
        self._s3.put_object(
            Bucket=self.bucket,
            Key=f"{self.prefix}/{MANIFEST_NAME}",
            Body=json.dumps({"generation": generation, "files": files}).encode(),
            ContentType="application/json",
        )
        self._remember(generation)
        unused = held - {self._blob_key(entry) for entry in files.values()}
        for key in sorted(unused):
            self._s3.delete_object(Bucket=self.bucket, Key=key)
        return Pushed(len(files), uploaded, uploaded_bytes)

    def pull(self) -> int | None:
        """Make the folder S3's copy when S3's is newer; how many files came down (None:
        the folder stays as it is, being as new as S3's copy, or S3 holding none)."""
        manifest = self._manifest()
        if manifest is None or manifest["generation"] == self._remembered():
            return None
        files = manifest["files"]
        self.folder.mkdir(parents=True, exist_ok=True)
        for name, entry in files.items():
            target = self.folder / name
            target.parent.mkdir(parents=True, exist_ok=True)
            partial = target.with_name(f"{target.name}.{os.getpid()}{_PARTIAL}")
            self._s3.download_file(self.bucket, self._blob_key(entry), str(partial))
            if (partial.stat().st_size, file_checksum(partial)) != (entry["size"], entry[CHECKSUM]):
                partial.unlink()
                raise MirrorError(f"{self.uri}: {name} differs from its manifest")
            os.replace(partial, target)
        for path in self.folder.rglob("*"):
            name = path.relative_to(self.folder).as_posix()
            if path.is_file() and name not in files and not path.name.endswith(_PARTIAL):
                path.unlink()  # the node's older copy had it; S3's newer one does not
        self._remember(manifest["generation"])
        return len(files)

    def _manifest(self) -> dict | None:
        try:
            body = self._s3.get_object(Bucket=self.bucket, Key=f"{self.prefix}/{MANIFEST_NAME}")
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") in ("404", "NoSuchKey"):
                return None
            raise
        return json.loads(body["Body"].read())

    def _blob_key(self, entry: dict) -> str:
        return f"{self.prefix}/blobs/{entry[CHECKSUM]}-{entry['size']}"

    def _blob_keys(self) -> list[str]:
        pages = self._s3.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=f"{self.prefix}/blobs/"
        )
        return [item["Key"] for page in pages for item in page.get("Contents", [])]

    def _remembered(self) -> str | None:
        try:
            return json.loads(self.record.read_text())["generation"]
        except (OSError, ValueError, KeyError):
            return None

    def _remember(self, generation: str) -> None:
        write_atomically(self.record, json.dumps({"generation": generation}).encode())
