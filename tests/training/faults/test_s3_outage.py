"""S3 unreachable during training (moto's server stopped, then started again)."""

from __future__ import annotations

import contextlib
import shutil
import uuid

import boto3
import pytest
from moto.server import ThreadedMotoServer

from tests.training.jobs import TINY, job_env, run_job, start_job, wait_while_running
from tests.training.multirank import free_port
from training.checkpoint.layout import COMMIT_MARKER, POINTER_NAME, committed_tags, tag_for
from training.checkpoint.s3 import S3Mirror

pytestmark = pytest.mark.multiprocess

STEPS = 30
JOB = (*TINY, "zero.stage=2", f"train.steps={STEPS}", "checkpoint.every_steps=2")


@pytest.fixture
def restartable_s3(monkeypatch):
    """moto in this process on a fixed free port: stop() and start() again keep its
    buckets (they live in moto's in-process backends, not in the HTTP server)."""
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    for key, value in {
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        # A refused connection fails fast instead of retrying for a minute.
        "AWS_MAX_ATTEMPTS": "2",
    }.items():
        monkeypatch.setenv(key, value)
    bucket = f"ckpt-{uuid.uuid4().hex[:12]}"
    boto3.client("s3").create_bucket(Bucket=bucket)
    state = {"server": server, "port": port, "uri": f"s3://{bucket}/runs/outage"}

    def restart():
        state["server"] = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
        state["server"].start()

    state["restart"] = restart
    yield state
    with contextlib.suppress(Exception):  # stopped by the test already
        state["server"].stop()


@pytest.mark.slow(
    reason="a real 2-rank job against an S3 that goes away and comes back", seconds=120
)
def test_training_goes_on_without_s3_and_the_mirror_catches_up(tmp_path, restartable_s3):
    """Injects: the S3 endpoint goes away after the first mirrored checkpoint and comes
    back three local checkpoints later. Proves: training never stops (exit 0), the
    failed uploads are logged, and the mirror holds the final checkpoint at the end."""
    uri = restartable_s3["uri"]
    mirror = S3Mirror.from_uri(uri)
    root = tmp_path / "checkpoints"
    job = start_job(tmp_path, *JOB, env=job_env(tmp_path, TRAIN_S3_URI=uri))
    try:
        wait_while_running(lambda: mirror.latest_tag() is not None, job, "a mirrored checkpoint")
        restartable_s3["server"].stop()
        mirrored = committed_tags(root)[-1]
        wait_while_running(
            lambda: len([t for t in committed_tags(root) if t > mirrored]) >= 3,
            job,
            "three checkpoints during the outage",
        )
        restartable_s3["restart"]()
        _, stderr = job.communicate(timeout=240)
    finally:
        job.kill()
    assert job.returncode == 0, stderr[-3000:]
    assert "could not mirror" in stderr
    assert mirror.latest_tag() == tag_for(STEPS)


@pytest.mark.slow(
    reason="a real 2-rank job against an S3 that goes away and comes back", seconds=120
)
def test_a_newer_but_incomplete_s3_copy_is_never_loaded(tmp_path, restartable_s3):
    """Injects: in S3, a checkpoint newer than the last good one, with its manifest and
    the pointer but only one of its files; the local disk is empty (a new machine).
    Proves: the job refuses that copy, resumes from the last complete one, and ends."""
    uri = restartable_s3["uri"]
    mirror = S3Mirror.from_uri(uri)
    first = run_job(
        tmp_path,
        *JOB[:-2],
        "train.steps=6",
        "checkpoint.every_steps=2",
        env=job_env(tmp_path, TRAIN_S3_URI=uri),
    )
    assert first.returncode == 0, first.stderr[-3000:]
    assert mirror.latest_tag() == tag_for(6)
    s3 = boto3.client("s3")
    good = tmp_path / "checkpoints" / tag_for(6)
    newer = tag_for(8)
    s3.upload_file(
        str(good / COMMIT_MARKER), mirror.bucket, f"{mirror.prefix}/{newer}/{COMMIT_MARKER}"
    )
    model = "mp_rank_00_model_states.pt"
    s3.upload_file(str(good / model), mirror.bucket, f"{mirror.prefix}/{newer}/{model}")
    s3.put_object(Bucket=mirror.bucket, Key=f"{mirror.prefix}/{POINTER_NAME}", Body=newer.encode())
    assert mirror.latest_tag() == newer  # S3 counts it: only the files tell it is incomplete
    shutil.rmtree(tmp_path / "checkpoints")

    resumed = run_job(
        tmp_path,
        *JOB[:-2],
        "train.steps=10",
        "checkpoint.every_steps=2",
        env=job_env(tmp_path, TRAIN_S3_URI=uri),
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"{newer} cannot be loaded" in resumed.stderr
    assert f"resumed from {tmp_path / 'checkpoints' / tag_for(6)} at step 6" in resumed.stderr
