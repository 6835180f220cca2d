"""Shared fixtures: a real S3 API (moto's server on loopback), a one-rank process group, and
a tiny Hugging Face model with its corpus."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path

import boto3
import pytest

from tests.training.multirank import free_port

_FAKE_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@pytest.fixture(scope="session")
def moto_endpoint():
    """``python -m moto.server`` on a free loopback port; its URL."""
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(url + "/moto-api/", timeout=1).close()
            break
        except (urllib.error.URLError, ConnectionError):
            if server.poll() is not None or time.monotonic() > deadline:
                server.kill()
                pytest.fail(f"moto server did not start on {url}")
            time.sleep(0.2)
    yield url
    server.terminate()
    server.wait(timeout=10)


@pytest.fixture
def s3_uri(moto_endpoint, monkeypatch):
    """A fresh bucket on the moto server; returns ``s3://bucket/prefix``.

    The endpoint and fake credentials go into the environment, where boto3
    (in this process and in launched ones) picks them up.
    """
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    for key, value in _FAKE_CREDENTIALS.items():
        monkeypatch.setenv(key, value)
    for key in ("AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(key, raising=False)
    bucket = f"ckpt-{uuid.uuid4().hex[:12]}"
    boto3.client("s3").create_bucket(Bucket=bucket)
    return f"s3://{bucket}/runs/test"


@pytest.fixture(scope="session")
def _process_group():
    import deepspeed
    import torch.distributed as dist

    if not dist.is_initialized():
        deepspeed.init_distributed(
            dist_backend="gloo",
            init_method=f"tcp://127.0.0.1:{free_port()}",
            rank=0,
            world_size=1,
            auto_mpi_discovery=False,
            verbose=False,
        )


@pytest.fixture
def single_rank(_process_group, monkeypatch):
    """A one-rank gloo group in this process, with the variables deepspeed.initialize wants.

    The variables are set for the test only, so processes launched by other
    tests do not inherit a rank.
    """
    for key, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"}.items():
        monkeypatch.setenv(key, value)


@pytest.fixture
def small_filesystem(tmp_path):
    """A 4 MiB tmpfs mounted for the test (root only; CI runs as root); its path."""
    from tests.support.tools import require_root

    require_root("mounts a small tmpfs to fill")
    mount_point = tmp_path / "small_disk"
    mount_point.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount_point)], check=True)
    yield mount_point
    subprocess.run(["umount", "-l", str(mount_point)], check=False)


def fill_disk(folder, *, leave: int) -> None:
    """Write a filler file in ``folder`` until its filesystem has about ``leave`` bytes free."""
    import shutil

    free = shutil.disk_usage(folder).free
    with open(folder / "filler", "wb") as handle:
        handle.write(b"\0" * max(0, free - leave))


@dataclass(frozen=True)
class TinyHf:
    """A tiny Llama and its tokenizer in `model` (tests/training/tiny_hf.py), and the
    JSON-lines corpus its tokenizer was trained on in `corpus` (field "text")."""

    model: Path
    corpus: Path
    texts: list[str]


@pytest.fixture(scope="session")
def tiny_hf(tmp_path_factory) -> TinyHf:
    from tests.training.tiny_hf import save_model, sentences, train_tokenizer, write_jsonl

    texts = sentences(200)
    model = save_model(tmp_path_factory.mktemp("tiny-llama"), train_tokenizer(texts))
    corpus = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
    write_jsonl(corpus, [{"id": i, "text": text} for i, text in enumerate(texts)])
    return TinyHf(model, corpus, texts)
