"""`python -m training export`: full fp32 weights from real checkpoints of ZeRO 0, 2 and 3."""

from __future__ import annotations

import deepspeed
import pytest
import torch

from training.checkpoint.checkpointer import Checkpointer
from training.checkpoint.export import ExportError, locate, main
from training.ds_config import build_ds_config
from training.model import build_gpt
from training.spec.config import load_config, validate


def _trained_checkpoint(root, stage: int) -> dict[str, torch.Tensor]:
    """Train a tiny GPT 3 steps on one rank, checkpoint it; return its weights."""
    config = load_config(None, [f"zero.stage={stage}", "train.micro_batch_size=2"], env={})
    ds = build_ds_config(config, validate(config, 1), on_gpu=False)
    torch.manual_seed(0)
    model = build_gpt("tiny", vocab_size=32, seq_len=8)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds)
    for step in range(3):
        inputs = torch.randint(32, (2, 8), generator=torch.Generator().manual_seed(step))
        engine.backward(engine(inputs, inputs.roll(1)))
        engine.step()
    Checkpointer(root).save(engine, 3, {"step": 3})
    if stage == 3:
        with deepspeed.zero.GatheredParameters(list(model.parameters())):
            return {n: p.detach().clone() for n, p in model.state_dict().items()}
    return {n: p.detach().clone() for n, p in model.state_dict().items()}


@pytest.mark.parametrize("stage", [0, 2, 3])
def test_export_writes_the_trained_weights(single_rank, tmp_path, stage, capsys):
    trained = _trained_checkpoint(tmp_path / "ckpt", stage)
    out = tmp_path / "model.pt"
    assert main([str(tmp_path / "ckpt"), str(out)]) == 0  # the root: newest committed step
    assert "from step_00000003" in capsys.readouterr().out
    exported = torch.load(out, weights_only=True)
    fresh = build_gpt("tiny", vocab_size=32, seq_len=8)
    fresh.load_state_dict(exported)  # strict: every key present, shapes right
    for name, tensor in trained.items():
        torch.testing.assert_close(exported[name], tensor.float(), msg=name)
    # A step folder works as well as the root.
    assert main([str(tmp_path / "ckpt" / "step_00000003"), str(out)]) == 0


def test_export_into_a_folder_not_made_yet_makes_it(single_rank, tmp_path):
    trained = _trained_checkpoint(tmp_path / "ckpt", 0)
    out = tmp_path / "exports" / "v1" / "model.pt"
    assert main([str(tmp_path / "ckpt"), str(out)]) == 0
    exported = torch.load(out, weights_only=True)
    assert exported.keys() == trained.keys()


def test_export_refuses_a_folder_without_committed_checkpoint(tmp_path, capsys):
    (tmp_path / "step_00000005").mkdir()
    assert main([str(tmp_path), str(tmp_path / "out.pt")]) == 2
    assert "holds no loadable checkpoint" in capsys.readouterr().err
    assert not (tmp_path / "out.pt").exists()
    with pytest.raises(ExportError):
        locate(tmp_path / "step_00000005")
