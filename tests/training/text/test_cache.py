"""JSON lines in S3 (moto's server) are tokenized once: the first node writes the cache on
its disk and beside the run's checkpoints, a second node downloads it, and a run of two
ranks there trains from it without tokenizing; new data makes a new cache."""

from __future__ import annotations

import logging
from urllib.parse import urlparse

import boto3
import pytest

from tests.training.jobs import job_env, run_job
from training.s3_folders import list_objects
from training.spec.config import load_config
from training.text.prepare import prepare

SEQ = 32


def upload(path, s3_uri: str, key: str) -> None:
    bucket, prefix = urlparse(s3_uri).netloc, urlparse(s3_uri).path.strip("/")
    boto3.client("s3").upload_file(str(path), bucket, f"{prefix}/{key}")


def files_of(folder) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@pytest.mark.multiprocess
@pytest.mark.slow(reason="a two-rank tiny-Llama job that reads the cache", seconds=120)
def test_s3_data_is_tokenized_once_and_read_from_the_cache(tmp_path, tiny_hf, s3_uri, caplog):
    upload(tiny_hf.corpus, s3_uri, "data/corpus.jsonl")
    run_uri = f"{s3_uri}/run"
    job = tmp_path / "job.toml"
    job.write_text(
        f'[model]\nhf = "{tiny_hf.model}"\n'
        f'[data]\nkind = "jsonl"\npath = "{s3_uri}/data/"\nseq_len = {SEQ}\n'
        "[train]\nsteps = 3\nmicro_batch_size = 2\n"
        '[scheduler]\nkind = "constant"\nwarmup_steps = 1\n'
        "[logging]\nprogress_bar = false\ntensorboard = false\n"
    )
    config = load_config(job)
    caplog.set_level(logging.INFO, logger="training.text.prepare")

    first = prepare(config, model_folder=tiny_hf.model, cache_dir=tmp_path / "a", s3_uri=run_uri)
    assert "tokenized in" in caplog.text
    remote = {o["Key"].rsplit("/", 1)[1] for o in list_objects(f"{run_uri}/tokens/{first.name}")}
    assert remote == set(files_of(first))

    caplog.clear()  # a second node: an empty disk, the same S3 prefix
    second = prepare(config, model_folder=tiny_hf.model, cache_dir=tmp_path / "b", s3_uri=run_uri)
    assert "downloading" in caplog.text and "tokenized in" not in caplog.text
    assert second.name == first.name and files_of(second) == files_of(first)

    # Two ranks on the second node train from its cache.
    env = job_env(tmp_path / "out", TRAIN_CACHE_DIR=str(tmp_path / "b"), TRAIN_S3_URI=run_uri)
    trained = run_job(tmp_path / "out", config=job, env=env, timeout=400)
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert f"tokenized data: {second} (this node's cache)" in trained.stderr
    assert "tokenized in" not in trained.stderr
    assert "2 worker(s)" in trained.stderr and [r["step"] for r in trained.metrics][-1] == 3

    # New data is a new cache.
    (tmp_path / "more.jsonl").write_text(tiny_hf.corpus.read_text() + '{"text": "a new fox"}\n')
    upload(tmp_path / "more.jsonl", s3_uri, "data/corpus.jsonl")
    caplog.clear()
    third = prepare(config, model_folder=tiny_hf.model, cache_dir=tmp_path / "b", s3_uri=run_uri)
    assert third.name != first.name and "tokenized in" in caplog.text
