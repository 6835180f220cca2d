"""`python -m training prepare`: tokenize a text job's data once, into a cache every rank
and every later run reads.

The launcher runs this step itself before starting any rank (so a job never waits on
tokenization it could have skipped, and a bad record fails the job in one line, exit 2,
with nothing trained). Its result is a folder named by a key of everything the tokens
depend on: the tokenizer's files, the encoding settings, the data's files (sizes and
modification times, S3 ETags, a Hub dataset's commit), the held-out split, and the
versions of transformers and tokenizers. It is looked for

1. on this node: TRAIN_CACHE_DIR/tokens/<key> (the node's local NVMe on the stack);
2. beside the run's checkpoints: TRAIN_S3_URI/tokens/<key>, downloaded whole;
3. else the data is read and tokenized on every core (text by the fast tokenizer's threads,
   chats by a process per core), written
   beside the target, renamed into place once complete, then uploaded to S3 with its
   manifest last; so a resume, a restart on another node or a second node of the job
   finds it and does not tokenize again.

The folder's format is training/text/packing.py's.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import logging
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict
from pathlib import Path

import numpy as np

from training.hf.source import TOKENIZER_FILES
from training.spec.config import Config, ConfigError
from training.text import sources
from training.text.packing import MANIFEST, token_dtype
from training.text.tokenize import Document, Encoder, Settings, encode_in_worker, start_worker

log = logging.getLogger(__name__)

FORMAT = 1  # of the prepared folder: a change here makes new keys
BATCH = 256  # records per tokenizing task


def tokenizer_fingerprint(folder: Path) -> str:
    """A hash of the tokenizer's files (what it encodes with) in the model's folder."""
    digest = hashlib.sha256()
    names = sorted({p.name for pattern in TOKENIZER_FILES for p in folder.glob(pattern)})
    for name in names:
        digest.update(name.encode() + b"\0" + (folder / name).read_bytes() + b"\0")
    return digest.hexdigest()


def splits(config: Config) -> list[str]:
    """The splits `prepare` writes: a streamed train split is read while training."""
    wanted = [name for name in sources.SPLITS if sources.has_split(config, name)]
    return [name for name in wanted if not (name == "train" and config.data.streaming)]


def cache_key(config: Config, model_folder: Path) -> str:
    import tokenizers
    import transformers

    described = {
        "format": FORMAT,
        "tokenizer": tokenizer_fingerprint(model_folder),
        "settings": asdict(Settings.of(config)),
        "splits": {name: sources.identity(config, name) for name in splits(config)},
        "val_fraction": config.data.val_fraction,
        "versions": [transformers.__version__, tokenizers.__version__],
    }
    text = json.dumps(described, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def prepare(
    config: Config,
    *,
    model_folder: Path,
    cache_dir: Path,
    s3_uri: str | None,
    progress: bool = True,
) -> Path:
    """The folder of the job's tokenized data, made if no cache has it."""
    key = cache_key(config, model_folder)
    local = cache_dir / "tokens" / key
    if (local / MANIFEST).is_file():
        log.info("tokenized data: %s (this node's cache)", local)
        return local
    remote = f"{s3_uri.rstrip('/')}/tokens/{key}" if s3_uri else None
    if remote is not None:
        from training.s3_folders import download_folder, exists

        if exists(f"{remote}/{MANIFEST}"):
            log.info("tokenized data: downloading %s to %s", remote, local)
            download_folder(remote, local)
            return local
    began = time.perf_counter()
    local.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=local.parent))
    try:
        manifest = _tokenize(config, model_folder, staging, progress=progress)
        manifest["key"] = key
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=1))  # last: complete
        if not local.exists():
            staging.rename(local)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    figures = ", ".join(
        f"{name}: {info['documents']:,} documents, {info['tokens']:,} tokens"
        for name, info in manifest["splits"].items()
    )
    log.info("tokenized in %.1f s (%s) into %s", time.perf_counter() - began, figures, local)
    if remote is not None:
        from training.s3_folders import upload_folder

        upload_folder(local, remote, marker=MANIFEST)
        log.info("tokenized data uploaded to %s", remote)
    return local


class _SplitWriter:
    """Appends documents to one split's files."""

    def __init__(self, folder: Path, name: str, dtype: np.dtype):
        self.folder, self.name, self.dtype = folder, name, dtype
        self.tokens = open(folder / f"{name}.tokens", "wb")  # noqa: SIM115
        self.starts = [0]
        self.trained: list[np.ndarray] = []
        self.labels: list[int] = []
        self.chat = False

    def add(self, document: Document) -> None:
        self.tokens.write(document.ids.astype(self.dtype).tobytes())
        self.starts.append(self.starts[-1] + len(document.ids))
        if document.trained is not None:
            self.chat = True
            self.trained.append(document.trained.astype(np.uint8))
        if document.label is not None:
            self.labels.append(document.label)

    def close(self) -> dict:
        self.tokens.close()
        np.asarray(self.starts, dtype=np.int64).tofile(self.folder / f"{self.name}.starts")
        if self.chat:
            trained = np.concatenate(self.trained) if self.trained else np.zeros(0, np.uint8)
            trained.tofile(self.folder / f"{self.name}.trained")
        if self.labels:
            np.asarray(self.labels, dtype=np.int64).tofile(self.folder / f"{self.name}.labels")
        return {"documents": len(self.starts) - 1, "tokens": self.starts[-1]}


def _tokenize(config: Config, model_folder: Path, staging: Path, *, progress: bool) -> dict:
    from transformers import AutoTokenizer

    trust = config.model.trust_remote_code
    tokenizer = AutoTokenizer.from_pretrained(model_folder, trust_remote_code=trust)
    settings = Settings.of(config)
    encoder = Encoder(tokenizer, settings)
    dtype = token_dtype(len(tokenizer))
    infos = {}
    for name in splits(config):
        if name == "val" and config.data.val_fraction > 0:
            continue  # divided from train's documents below
        writers = {name: _SplitWriter(staging, name, dtype)}
        if name == "train" and config.data.val_fraction > 0:
            writers["val"] = _SplitWriter(staging, "val", dtype)
        where = sources.location(config, name) or config.data.path
        try:
            batches = _batched(sources.records(config, name), BATCH)
            first = next(batches, None)
            if first is None:
                raise ConfigError(f"{where} holds no records")
            encoder.check_fields(first[0], where)
            documents = _documents(encoder, model_folder, trust, itertools.chain([first], batches))
            for index, document in enumerate(_progress(documents, name, progress)):
                held_out = "val" in writers and _held_out(index, config.data.val_fraction)
                writers["val" if held_out else name].add(document)
        except ValueError as error:  # a bad record, or one the readers cannot parse
            if isinstance(error, ConfigError):
                raise
            raise ConfigError(f"{where}: {str(error).splitlines()[0]}") from None
        except Exception as error:
            if type(error).__module__.startswith(("datasets", "pyarrow")):
                raise ConfigError(f"{where} cannot be read: {str(error).splitlines()[0]}") from None
            raise
        for split, writer in writers.items():
            infos[split] = writer.close()
    for split, info in infos.items():
        if info["documents"] == 0:
            raise ConfigError(f"the {split} split of {config.data.path!r} holds no documents")
    return {
        "format": FORMAT,
        "dtype": dtype.name,
        "splits": infos,
        "special_ids": sorted(set(tokenizer.all_special_ids)),
        "mask_id": tokenizer.mask_token_id,
        "pad_id": _pad_id(tokenizer),
        "settings": asdict(settings),
    }


def _pad_id(tokenizer) -> int:
    for candidate in (tokenizer.pad_token_id, tokenizer.eos_token_id, 0):
        if candidate is not None:
            return candidate
    return 0


def _held_out(index: int, fraction: float) -> bool:
    """Whether document `index` goes to the held-out split: a fixed hash of the index, so
    the same documents are held out in every preparation."""
    import xxhash

    return xxhash.xxh64_intdigest(index.to_bytes(8, "little"), seed=FORMAT) < fraction * 2**64


def _batched(records: Iterable[dict], size: int) -> Iterator[list[dict]]:
    iterator = iter(records)
    while batch := list(itertools.islice(iterator, size)):
        yield batch


def _documents(
    encoder: Encoder, model_folder: Path, trust: bool, batches: Iterator[list[dict]]
) -> Iterator[Document]:
    """Documents in the records' order, on every core. Text is encoded here: the fast
    tokenizer encodes a batch on all cores itself (tokenizers' encode_batch, a Rust thread
    pool). Chats are rendered by the chat template in Python, so past one batch they are
    encoded by a process per core, each with its own tokenizer."""
    first = next(batches)
    second = next(batches, None)
    if encoder.settings.messages_field is None or second is None:
        # Small chat data: starting processes would cost more than it saves.
        for batch in itertools.chain([first], [second] if second else [], batches):
            yield from encoder(batch)
        return
    context = multiprocessing.get_context("forkserver")
    # The fork server imports transformers once; each process is forked from it.
    context.set_forkserver_preload(["transformers"])
    with context.Pool(
        _cores(), initializer=start_worker, initargs=(model_folder, encoder.settings, trust)
    ) as pool:
        for documents in pool.imap(encode_in_worker, itertools.chain([first, second], batches)):
            yield from documents


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def _progress(documents: Iterator[Document], split: str, shown: bool) -> Iterator[Document]:
    from tqdm import tqdm

    yield from tqdm(
        documents, desc=f"tokenizing {split}", unit=" documents", disable=not shown, file=sys.stderr
    )


def parser() -> argparse.ArgumentParser:
    from training.spec.config import add_overrides_argument

    p = argparse.ArgumentParser(
        prog="python -m training prepare",
        description="Tokenize a text job's data into the cache training reads "
        "(TRAIN_CACHE_DIR, and TRAIN_S3_URI/tokens when set). Training runs this itself.",
    )
    p.add_argument("--config", help="TOML config file (default: TRAIN_CONFIG)")
    add_overrides_argument(p)
    return p
