"""Same-size damage to any checkpoint file is caught by the manifest's checksums, on resume
(local or S3 copy) and on export, and the previous committed checkpoint is used."""

from __future__ import annotations

import logging

import boto3
import pytest
import torch

from tests.training.checkpoint_engine import build_engine, train_step, weights
from tests.training.damage import TARGETS, damage, flip_bytes
from training.checkpoint.checkpointer import Checkpointer
from training.checkpoint.export import main as export_main
from training.checkpoint.layout import DAMAGED, examine, tag_for
from training.checkpoint.s3 import S3Mirror

LOGGER = "training.checkpoint"


def trained_engine(steps: int):
    engine = build_engine()
    for step in range(steps):
        train_step(engine, step)
    return engine


def same_weights(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("target", TARGETS)
def test_damaged_newest_checkpoint_resumes_from_the_previous(single_rank, tmp_path, caplog, target):
    checkpointer = Checkpointer(tmp_path)
    at_two = trained_engine(2)
    checkpointer.save(at_two, 2, {"step": 2})
    checkpointer.save(trained_engine(4), 4, {"step": 4})
    size_before = {p: p.stat().st_size for p in (tmp_path / tag_for(4)).iterdir()}
    name = damage(tmp_path / tag_for(4), target)
    assert {p: p.stat().st_size for p in (tmp_path / tag_for(4)).iterdir()} == size_before

    resumed = build_engine(seed=1)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert Checkpointer(tmp_path).resume(resumed)["step"] == 2
    assert f"{tmp_path / tag_for(4)} is damaged" in caplog.text
    assert name in caplog.text
    assert same_weights(weights(resumed), weights(at_two))


@pytest.mark.parametrize("target", TARGETS)
def test_export_refuses_a_damaged_step_and_skips_it_in_a_root(
    single_rank, tmp_path, capsys, target
):
    root = tmp_path / "ckpt"
    checkpointer = Checkpointer(root)
    checkpointer.save(trained_engine(2), 2, {"step": 2})
    checkpointer.save(trained_engine(4), 4, {"step": 4})
    name = damage(root / tag_for(4), target)

    out = tmp_path / "model.pt"
    assert export_main([str(root / tag_for(4)), str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "damaged" in err and name in err
    assert not out.exists()

    assert export_main([str(root), str(out)]) == 0
    captured = capsys.readouterr()
    assert "from step_00000002" in captured.out
    assert f"skipping {root / tag_for(4)}" in captured.err and name in captured.err


def test_a_garbled_pointer_does_not_stop_export(single_rank, tmp_path, capsys):
    Checkpointer(tmp_path).save(trained_engine(2), 2, {"step": 2})
    (tmp_path / "latest_committed").write_bytes(b"\xff\xfe\x00garbage")
    assert export_main([str(tmp_path), str(tmp_path / "model.pt")]) == 0
    assert "from step_00000002" in capsys.readouterr().out


def test_a_damaged_s3_copy_is_refused_and_the_previous_fetched(
    single_rank, tmp_path, caplog, s3_uri
):
    """The local disk is gone (a new machine); S3's copy of the newest checkpoint has a
    same-size damaged model file: the one before it is fetched and loaded."""
    mirror = S3Mirror.from_uri(s3_uri)
    checkpointer = Checkpointer(tmp_path / "old", mirror=mirror)
    at_two = trained_engine(2)
    checkpointer.save(at_two, 2, {"step": 2})
    checkpointer.save(trained_engine(4), 4, {"step": 4})
    s3 = boto3.client("s3")
    key = f"{mirror.prefix}/{tag_for(4)}/mp_rank_00_model_states.pt"
    local = tmp_path / "model_states.pt"
    s3.download_file(mirror.bucket, key, str(local))
    flip_bytes(local)
    s3.upload_file(str(local), mirror.bucket, key)

    resumed = build_engine(seed=1)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        state = Checkpointer(tmp_path / "new", mirror=mirror).resume(resumed)
    assert state["step"] == 2
    assert "mp_rank_00_model_states.pt does not match its checksum" in caplog.text
    assert same_weights(weights(resumed), weights(at_two))


def test_examine_sees_the_flip_only_when_verifying(single_rank, tmp_path):
    step_dir = Checkpointer(tmp_path).save(trained_engine(2), 2, {"step": 2})
    flip_bytes(step_dir / "mp_rank_00_model_states.pt", count=1)
    assert examine(step_dir)[0] != DAMAGED  # sizes only: cheap, used when pruning
    state, reason = examine(step_dir, verify=True)
    assert state == DAMAGED and "mp_rank_00_model_states.pt" in reason
