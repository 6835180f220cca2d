"""Each profile's shipped job, run tiny on CPU (2 gloo ranks): loss falls, a run resumed
from its step-4 checkpoint continues exactly as the uninterrupted run, and the weights
export. The image job reads a generated image folder, and tar shards from S3."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlparse

import boto3
import numpy as np
import pytest
import torch

from examples.image_classification.make_images import make_images
from tests.training.jobs import Job, job_env, run_job
from tests.training.multirank import REPO_ROOT
from tests.training.tiny_hf import write_jsonl
from training.components import build_eval_dataset, build_model
from training.spec.config import load_config

pytestmark = pytest.mark.multiprocess

JOBS = REPO_ROOT / "jobs"
STEPS, CHECKPOINT = 8, 4
SMALL_RUN = (
    f"train.steps={STEPS}",
    f"checkpoint.every_steps={CHECKPOINT}",
    "scheduler.warmup_steps=2",
    "logging.every_steps=1",
    "logging.progress_bar=false",
    "logging.tensorboard=false",
)
# The l4x1 job (ResNet-50, bf16) as a CPU can run it: a tiny ResNet, fp32 (no half precision on
# CPU), 32-pixel crops of 4 generated classes.
IMAGE = (
    *SMALL_RUN,
    "precision.bf16=false",
    "model.preset=resnet-tiny",
    "data.num_classes=4",
    "data.image_size=32",
    "data.num_workers=2",
    "train.global_batch_size=16",
    "train.micro_batch_size=8",
    "optimizer.lr=1e-2",
    f"logging.eval_every_steps={CHECKPOINT}",
)
TINY_TRANSFORMER = (
    *SMALL_RUN,
    "model.n_layer=2",
    "model.n_head=2",
    "model.n_embd=64",
    "data.vocab_size=64",
    "train.global_batch_size=8",
    "train.micro_batch_size=2",
    "optimizer.lr=3e-3",
)
# The a100x8 job keeps its sequence length of 512 and bf16.
BERT = (*TINY_TRANSFORMER,)


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    return make_images(tmp_path_factory.mktemp("images"), classes=4, train=64, val=32)


@pytest.fixture(scope="module")
def tokens(tmp_path_factory) -> Path:
    """A token file of counting sequences 0..63, 0..63, ...: learnable for both objectives."""
    path = tmp_path_factory.mktemp("tokens") / "train.bin"
    np.tile(np.arange(64, dtype=np.uint16), 2048).tofile(path)
    return path


def train_and_resume(tmp_path: Path, job: str | Path, *overrides: str) -> tuple[Job, Job]:
    """The uninterrupted run, and a run that resumed from its step-4 checkpoint."""
    config = JOBS / job  # a path of its own when `job` is one
    whole = run_job(tmp_path / "whole", *overrides, config=config, timeout=400)
    assert whole.returncode == 0, whole.stderr[-3000:]
    step = f"step_{CHECKPOINT:08d}"
    shutil.copytree(
        whole.output_dir / "checkpoints" / step, tmp_path / "resumed" / "checkpoints" / step
    )
    resumed = run_job(tmp_path / "resumed", *overrides, config=config, timeout=400)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resumed from {tmp_path / 'resumed' / 'checkpoints'}/{step}" in resumed.stderr
    return whole, resumed


def assert_trains_and_resumes_exactly(whole: Job, resumed: Job) -> None:
    losses = whole.losses
    assert [r["step"] for r in whole.metrics] == list(range(1, STEPS + 1))
    assert sum(losses[-3:]) < sum(losses[:3])
    got, want = resumed.metrics, whole.metrics[CHECKPOINT:]
    assert [r["step"] for r in got] == list(range(CHECKPOINT + 1, STEPS + 1))
    for new, old in zip(got, want, strict=True):
        for key in ("loss", "epoch", "samples_seen_in_epoch", "val_loss", "val_accuracy"):
            assert new.get(key) == old.get(key), (new["step"], key)


def export(job: Job, tmp_path: Path) -> dict[str, torch.Tensor]:
    out = tmp_path / "model.pt"
    done = subprocess.run(
        [sys.executable, "-m", "training", "export", str(job.output_dir / "checkpoints"), str(out)],
        cwd=REPO_ROOT,
        env=job_env(job.output_dir),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"from step_{STEPS:08d}" in done.stdout
    return torch.load(out, weights_only=True)


def held_out_accuracy(config_path: Path, overrides: tuple[str, ...], state: dict) -> float:
    """Top-1 of the exported weights on val/, computed here, one image at a time."""
    config = load_config(config_path, overrides)
    model = build_model(config)
    model.load_state_dict(state)  # strict: every parameter and BatchNorm statistic
    model.eval()
    held_out = build_eval_dataset(config)
    with torch.no_grad():
        right = sum(int(model.logits(image[None]).argmax() == label) for image, label in held_out)
    return right / len(held_out)


@pytest.mark.slow(
    reason="a shipped workload's job trained, resumed and exported for real", seconds=220
)
def test_v100_image_job_trains_resumes_reports_accuracy_and_exports(tmp_path, images):
    overrides = (*IMAGE, f"data.path={images / 'folder'}")
    whole, resumed = train_and_resume(tmp_path, "l4x1.toml", *overrides)
    assert_trains_and_resumes_exactly(whole, resumed)
    evaluated = [r for r in whole.metrics if "val_accuracy" in r]
    assert [r["step"] for r in evaluated] == [CHECKPOINT, STEPS]
    accuracy = evaluated[-1]["val_accuracy"]
    assert accuracy > 0.5  # 4 classes: chance is 0.25
    assert f"top-1 {100 * accuracy:.1f}%" in whole.stdout
    assert "images/s" in whole.stdout
    state = export(whole, tmp_path)
    assert held_out_accuracy(JOBS / "l4x1.toml", overrides, state) == accuracy


@pytest.mark.slow(
    reason="a shipped workload's job trained, resumed and exported for real", seconds=210
)
def test_image_shards_from_s3_resume_with_the_same_samples(tmp_path, images, s3_uri):
    bucket, prefix = urlparse(s3_uri).netloc, urlparse(s3_uri).path.strip("/")
    client = boto3.client("s3")
    for shard in sorted((images / "shards").rglob("*.tar")):
        key = f"{prefix}/{shard.relative_to(images / 'shards').as_posix()}"
        client.upload_file(str(shard), bucket, key)
    overrides = (*IMAGE, "data.kind=image_shards", f"data.path={s3_uri}")
    whole, resumed = train_and_resume(tmp_path, "l4x1.toml", *overrides)
    assert_trains_and_resumes_exactly(whole, resumed)


@pytest.mark.slow(
    reason="a shipped workload's job trained, resumed and exported for real", seconds=110
)
def test_bert_base_512_job_trains_resumes_and_exports(tmp_path, tokens):
    whole, resumed = train_and_resume(tmp_path, "a100x8.toml", *BERT, f"data.path={tokens}")
    assert_trains_and_resumes_exactly(whole, resumed)
    state = export(whole, tmp_path)
    # 64 data tokens + the mask token; position table of the job's 512.
    assert state["wte.weight"].shape == (65, 64)
    assert state["wpe.weight"].shape == (512, 64)


@pytest.mark.slow(
    reason="a shipped workload's job trained, resumed and exported for real", seconds=160
)
def test_large_nlp_job_streams_resumes_and_exports_at_zero_3(tmp_path, tiny_hf):
    """The a100x8-80g job (a Hub model at ZeRO-3, built partitioned, activation
    checkpointing, its data streamed) over the tiny Llama and two local JSON-lines files,
    one per rank: each rank's stream position comes back with the checkpoint."""
    from transformers import AutoModelForCausalLM

    shards = tmp_path / "corpus"
    shards.mkdir()
    for part in range(2):
        records = [{"text": text} for text in tiny_hf.texts[part::2]]
        write_jsonl(shards / f"part-{part}.jsonl", records)
    # The job's Hub dataset subset does not apply to local files.
    text = (JOBS / "a100x8-80g.toml").read_text()
    assert 'subset = "sample-10BT"\n' in text
    job = tmp_path / "a100x8-80g.toml"
    job.write_text(text.replace('subset = "sample-10BT"\n', ""))
    overrides = (
        *SMALL_RUN,
        "precision.bf16=false",
        f"model.hf={tiny_hf.model}",
        "data.kind=jsonl",
        f"data.path={shards}",
        "data.seq_len=32",
        "train.global_batch_size=8",
        "train.micro_batch_size=2",
        "optimizer.lr=3e-3",
    )
    whole, resumed = train_and_resume(tmp_path, job, *overrides)
    assert_trains_and_resumes_exactly(whole, resumed)
    out = tmp_path / "exported"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "training",
            "export",
            str(whole.output_dir / "checkpoints"),
            str(out),
        ],
        cwd=REPO_ROOT,
        env=job_env(whole.output_dir),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.config.num_hidden_layers == 2 and model.dtype == torch.float32
