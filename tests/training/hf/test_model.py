"""The Hugging Face model as the trainer runs it (training/hf/model.py)."""

from __future__ import annotations

import torch

from training.hf.model import HfTask, build
from training.spec.config import load_config


def test_a_packed_document_sees_only_itself(tmp_path, tiny_hf):
    """Two documents in one window (positions restarting at the second): the second's
    logits are those it has alone."""
    job = tmp_path / "job.toml"
    job.write_text(f'[model]\nhf = "{tiny_hf.model}"\n[data]\nkind = "jsonl"\npath = "x.jsonl"\n')
    task = build(load_config(job), tiny_hf.model, None, on_gpu=False).eval()
    assert isinstance(task, HfTask)
    ids = torch.randint(3, 300, (1, 12), generator=torch.Generator().manual_seed(0))
    positions = torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5, 6]])
    with torch.no_grad():
        packed = task.logits(ids, positions)[:, 5:]
        alone = task.logits(ids[:, 5:], positions[:, 5:])
        as_one = task.logits(ids, torch.arange(12)[None])[:, 5:]
    assert (packed - alone).abs().max() < 1e-5
    assert (as_one - alone).abs().max() > 1e-3  # read as one document, it sees the first
