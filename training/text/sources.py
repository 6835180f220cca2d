"""The documents of a text job: records read from JSON lines, Parquet or plain text files
(local, or under an S3 prefix), or a dataset on the Hub, as one stream of dicts.

Every kind becomes a `datasets.IterableDataset` (Hugging Face datasets, streaming mode):
records are read lazily, file by file, never copied whole to the disk first, and the same
stream serves `prepare` (read once, tokenized into the cache) and `data.streaming` (read
while training: sharded over the ranks with `split_dataset_by_node`, its position kept by
`state_dict`). Local files and Hub datasets go through datasets' own readers
(`load_dataset(..., streaming=True)`); S3 objects through boto3 and
`IterableDataset.from_generator`, one shard per object: datasets' S3 path needs s3fs,
whose aiobotocore pins a botocore older than the one this project pins.

`identity` names what the records are made of (files with sizes and modification times,
objects with ETags, a Hub dataset's commit), for the cache key of the tokenized data.
"""

from __future__ import annotations

import glob
import gzip
import io
import json
from collections.abc import Iterator
from pathlib import Path

from training.spec.config import Config, ConfigError

SPLITS = ("train", "val")
# File names each kind reads in a folder, a glob or an S3 prefix.
SUFFIXES = {
    "jsonl": (".jsonl", ".json", ".jsonl.gz", ".json.gz"),
    "parquet": (".parquet",),
    "text-files": (".txt", ".md"),
}
# datasets' reader for each kind of local file (datasets/packaged_modules).
_BUILDERS = {"jsonl": "json", "parquet": "parquet", "text-files": "text"}


def location(config: Config, split: str) -> str | None:
    """data.path (train) or data.val_path (val): None when the split is not a path."""
    return config.data.path if split == "train" else config.data.val_path


def has_split(config: Config, split: str) -> bool:
    """Whether the job has `split`: train always; val when given or held out."""
    data = config.data
    return split == "train" or bool(data.val_path or data.val_split or data.val_fraction)


def _key(split: str) -> str:
    return "data.path" if split == "train" else "data.val_path"


def files(config: Config, split: str) -> list[str]:
    """The split's files, sorted: local paths, or s3:// URIs of objects."""
    return [path for path, _, _ in _listing(config, split)]


def _listing(config: Config, split: str) -> list[tuple[str, int, str | int]]:
    """(path or s3:// URI, size, version) of each of the split's files, sorted; the
    version is an object's ETag or a file's modification time."""
    kind, where = config.data.kind, location(config, split)
    suffixes = SUFFIXES[kind]
    if where.startswith("s3://"):
        found = _s3_listing(where, suffixes)
    elif any(char in where for char in "*?["):
        found = [_stat(p) for p in sorted(glob.glob(where, recursive=True)) if Path(p).is_file()]
    elif Path(where).is_file():
        return [_stat(where)]
    elif Path(where).is_dir():
        found = [
            _stat(str(p))
            for p in sorted(Path(where).rglob("*"))
            if p.is_file() and p.name.endswith(suffixes)
        ]
    else:
        raise ConfigError(
            f"{_key(split)} = {where!r} does not exist: give a file, a folder, a glob or "
            "s3://bucket/prefix"
        )
    if not found:
        raise ConfigError(
            f"{_key(split)} = {where!r} holds no {kind} files ({', '.join(suffixes)})"
        )
    return found


def _stat(path: str) -> tuple[str, int, int]:
    status = Path(path).stat()
    return str(Path(path).resolve()), status.st_size, status.st_mtime_ns


def _s3_listing(where: str, suffixes: tuple[str, ...]) -> list[tuple[str, int, str]]:
    from training.s3_folders import list_objects, split_uri

    bucket, prefix = split_uri(where)
    if prefix.endswith(suffixes):  # one object: its folder's listing has it
        folder = f"s3://{bucket}/{prefix.rpartition('/')[0]}"
        objects = [o for o in list_objects(folder) if o["Key"] == prefix]
    else:
        objects = [o for o in list_objects(where) if o["Key"].endswith(suffixes)]
    return [(f"s3://{bucket}/{o['Key']}", o["Size"], o["ETag"]) for o in objects]


def identity(config: Config, split: str) -> list:
    """What the split's records are made of, for the cache key: a change to any file
    (size, modification time, S3 ETag) or a new Hub commit makes a new key."""
    data = config.data
    if data.kind == "hf-dataset":
        from huggingface_hub import HfApi

        try:
            info = HfApi().dataset_info(data.path, revision=data.revision)
        except Exception as error:
            raise _hub_error(config, error) from None
        return [data.path, info.sha, data.subset, hub_split(config, split)]
    return [list(entry) for entry in _listing(config, _read_from(config, split))]


def _read_from(config: Config, split: str) -> str:
    """The split whose files hold `split`'s records: a held-out fraction is train's."""
    return split if location(config, split) else "train"


def hub_split(config: Config, split: str) -> str:
    return config.data.split if split == "train" else config.data.val_split


def records(config: Config, split: str):
    """The split's records as a datasets.IterableDataset (lazy: nothing is read yet).

    A held-out fraction reads train's records (training/text/prepare.py divides them)."""
    from datasets import IterableDataset, load_dataset

    data = config.data
    if data.kind == "hf-dataset":
        try:
            return load_dataset(
                data.path,
                name=data.subset,
                split=hub_split(config, split),
                revision=data.revision,
                streaming=True,
            )
        except Exception as error:
            raise _hub_error(config, error) from None
    paths = files(config, _read_from(config, split))
    if paths[0].startswith("s3://"):
        return IterableDataset.from_generator(
            _s3_records, gen_kwargs={"uris": paths, "kind": data.kind}
        )
    options = {"sample_by": "document"} if data.kind == "text-files" else {}
    return load_dataset(
        _BUILDERS[data.kind], data_files=paths, split="train", streaming=True, **options
    )


def _s3_records(uris: list[str], kind: str) -> Iterator[dict]:
    """Records of S3 objects, read as they stream in (a Parquet file whole: its footer
    comes last)."""
    import boto3

    from training.s3_folders import split_uri

    client = boto3.client("s3")
    for uri in uris:
        bucket, key = split_uri(uri)
        body = client.get_object(Bucket=bucket, Key=key)["Body"]
        if kind == "parquet":
            import pyarrow.parquet as pq

            table = pq.read_table(io.BytesIO(body.read()))
            yield from table.to_pylist()
        elif kind == "text-files":
            yield {"text": body.read().decode("utf-8")}
        else:
            stream = gzip.GzipFile(fileobj=body) if key.endswith(".gz") else body
            for number, line in enumerate(io.TextIOWrapper(stream, encoding="utf-8"), 1):
                if line.strip():
                    try:
                        yield json.loads(line)
                    except json.JSONDecodeError as error:
                        raise ValueError(f"{uri} line {number} is not JSON: {error}") from None


def _hub_error(config: Config, error: Exception) -> Exception:
    from huggingface_hub.errors import (
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
    )

    name = config.data.path
    if isinstance(error, GatedRepoError):
        return ConfigError(
            f"data.path = {name!r} is a gated dataset: accept its terms on the Hub and set "
            "HF_TOKEN to a token of that account"
        )
    if isinstance(error, RepositoryNotFoundError) or type(error).__name__ == (
        "DatasetNotFoundError"
    ):
        return ConfigError(f"data.path = {name!r} is not a dataset on the Hub: check the id")
    if isinstance(error, LocalEntryNotFoundError | ConnectionError):
        return ConfigError(
            f"data.path = {name!r}: cannot reach the Hub to read the dataset: connect this "
            "machine, or prepare the data where there is a network (python -m training "
            "prepare) with TRAIN_S3_URI set, so that this node reads the cache"
        )
    return error
