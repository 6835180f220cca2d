"""data.streaming: each rank reads its own files as they stream in, from a folder or from
S3, and its position survives a restart exactly, across the end of an epoch too."""

from __future__ import annotations

import itertools
from urllib.parse import urlparse

import boto3

from tests.training.tiny_hf import write_jsonl
from training.spec.config import load_config
from training.text.stream import StreamedWindows

SEQ = 16


def shards(folder, texts, count: int):
    folder.mkdir()
    for shard in range(count):
        write_jsonl(folder / f"part-{shard}.jsonl", [{"text": t} for t in texts[shard::count]])
    return folder


def streamed(tmp_path, tiny_hf, path: str, *, rank: int, world_size: int) -> StreamedWindows:
    toml = tmp_path / "job.toml"
    toml.write_text(
        f'[model]\nhf = "{tiny_hf.model}"\n[data]\nkind = "jsonl"\npath = "{path}"\n'
        f"seq_len = {SEQ}\nstreaming = true\n"
    )
    return StreamedWindows(load_config(toml), tiny_hf.model, rank=rank, world_size=world_size)


def take(iterator, count: int) -> list[list[list[int]]]:
    return [[part.tolist() for part in window] for window in itertools.islice(iterator, count)]


def test_a_resumed_stream_continues_at_the_next_window_across_epochs(tmp_path, tiny_hf):
    folder = shards(tmp_path / "corpus", tiny_hf.texts[:40], count=4)
    first = streamed(tmp_path, tiny_hf, str(folder), rank=0, world_size=2)
    windows = iter(first)
    epochs = []  # the epoch of each window rank 0 reads, in order
    while len(epochs) < 2 or epochs[-1] == 0:
        next(windows)
        epochs.append(first.epoch)
    per_epoch = len(epochs) - 1  # rank 0 reads 2 of the 4 files: this many windows
    assert per_epoch > 5
    # A checkpoint 3 windows before the end of epoch 0; 10 more windows cross into epoch 1.
    again = streamed(tmp_path, tiny_hf, str(folder), rank=0, world_size=2)
    windows = iter(again)
    before = take(windows, per_epoch - 3)
    state = again.state_dict()
    after = take(windows, 10)
    assert again.epoch == 1
    resumed = streamed(tmp_path, tiny_hf, str(folder), rank=0, world_size=2)
    resumed.load_state_dict(state)
    assert take(iter(resumed), 10) == after
    # Epoch 1 repeats epoch 0, and the other rank reads the other files.
    assert after[3:] == before[:7]
    other = streamed(tmp_path, tiny_hf, str(folder), rank=1, world_size=2)
    assert take(iter(other), 10) != before[:10]


def test_s3_objects_stream_as_the_same_windows_as_the_files(tmp_path, tiny_hf, s3_uri):
    folder = shards(tmp_path / "corpus", tiny_hf.texts[:40], count=2)
    bucket, prefix = urlparse(s3_uri).netloc, urlparse(s3_uri).path.strip("/")
    for path in sorted(folder.iterdir()):
        boto3.client("s3").upload_file(str(path), bucket, f"{prefix}/corpus/{path.name}")
    from_s3 = streamed(tmp_path, tiny_hf, f"{s3_uri}/corpus/", rank=0, world_size=1)
    from_files = streamed(tmp_path, tiny_hf, str(folder), rank=0, world_size=1)
    assert take(iter(from_s3), 40) == take(iter(from_files), 40)
