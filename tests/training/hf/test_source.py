"""Where a model's files come from: a folder as it is, an S3 prefix copied once to the
node's cache and found there by every rank, and config.json alone for `estimate`."""

from __future__ import annotations

from urllib.parse import urlparse

import boto3
import pytest

from training.hf.source import OBJECTS_RECORD, config_file, fetch, local_folder
from training.spec.config import ConfigError, load_config


def config_for(tmp_path, model: str):
    job = tmp_path / "job.toml"
    job.write_text(f'[model]\nhf = "{model}"\n[data]\nkind = "jsonl"\npath = "x.jsonl"\n')
    return load_config(job)


def test_an_s3_model_is_copied_once_and_found_by_the_ranks(tmp_path, tiny_hf, s3_uri):
    bucket, prefix = urlparse(s3_uri).netloc, urlparse(s3_uri).path.strip("/")
    for path in sorted(tiny_hf.model.iterdir()):
        boto3.client("s3").upload_file(str(path), bucket, f"{prefix}/model/{path.name}")
    config = config_for(tmp_path, f"{s3_uri}/model")
    cache = tmp_path / "cache"
    folder = fetch(config, cache)
    assert folder.parent == cache / "models"
    copied = {p.name: p.read_bytes() for p in folder.iterdir() if p.name != OBJECTS_RECORD}
    assert copied == {p.name: p.read_bytes() for p in tiny_hf.model.iterdir()}
    assert local_folder(config, cache) == folder  # a rank: no S3 call needed
    modified = (folder / "model.safetensors").stat().st_mtime_ns
    assert fetch(config, cache) == folder  # unchanged in S3: not copied again
    assert (folder / "model.safetensors").stat().st_mtime_ns == modified
    # A new config.json in S3 is a new copy.
    boto3.client("s3").put_object(
        Bucket=bucket, Key=f"{prefix}/model/config.json", Body=b'{"model_type": "llama"}'
    )
    assert (fetch(config, cache) / "config.json").read_bytes() == b'{"model_type": "llama"}'
    assert config_file(config).read_bytes() == b'{"model_type": "llama"}'
    with pytest.raises(ConfigError, match=r"holds no config\.json"):
        fetch(config_for(tmp_path, f"{s3_uri}/nothing-here"), cache)


def test_a_folder_is_used_as_it_is_and_must_hold_a_model(tmp_path, tiny_hf):
    assert fetch(config_for(tmp_path, str(tiny_hf.model)), tmp_path) == tiny_hf.model
    with pytest.raises(ConfigError, match=r"has no config\.json"):
        fetch(config_for(tmp_path, str(tmp_path)), tmp_path)
    with pytest.raises(ConfigError, match="is not a folder on this machine"):
        fetch(config_for(tmp_path, str(tmp_path / "missing")), tmp_path)
    with pytest.raises(ConfigError, match="nor a Hub model id"):
        fetch(config_for(tmp_path, "not a model//id"), tmp_path)
