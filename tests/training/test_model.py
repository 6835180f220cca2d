"""The GPT model: preset sizes, the FLOPs formula, and activation checkpointing."""

from __future__ import annotations

import pytest
import torch

from training.model import build_gpt, mask_token_id
from training.spec.presets import PRESETS


def _tiny(**kwargs):
    torch.manual_seed(0)
    return build_gpt("tiny", vocab_size=64, seq_len=16, **kwargs)


@pytest.mark.parametrize(
    ("preset", "millions"), [("gpt-124m", 124), ("gpt-350m", 355), ("gpt-1.3b", 1314)]
)
def test_presets_have_their_advertised_size(preset, millions):
    with torch.device("meta"):  # shapes only: no memory, no init cost
        model = build_gpt(preset, vocab_size=50257, seq_len=1024)
    assert round(model.num_params(non_embedding=False) / 1e6) == millions


def test_flops_per_token_matches_a_hand_computation():
    model = build_gpt("tiny", vocab_size=64, seq_len=16)
    # tiny: L=2, H=2, d=64. Per block: qkv 64*192+192, proj 64*64+64, fc 64*256+256,
    # proj 256*64+64, two LayerNorms 2*128. Plus wte 64*64 (tied lm_head), final LN 128.
    block = (64 * 192 + 192) + (64 * 64 + 64) + (64 * 256 + 256) + (256 * 64 + 64) + 256
    n = 2 * block + 64 * 64 + 128
    assert model.num_params() == n
    assert model.flops_per_token(16) == 6 * n + 12 * 2 * 2 * 32 * 16


def test_activation_checkpointing_leaves_loss_and_gradients_unchanged():
    inputs = torch.randint(64, (4, 16), generator=torch.Generator().manual_seed(1))
    targets = torch.roll(inputs, -1, dims=1)
    grads = []
    for checkpointing in (False, True):
        model = _tiny(activation_checkpointing=checkpointing)
        loss = model(inputs, targets)
        loss.backward()
        grads.append((loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    (loss_plain, plain), (loss_ckpt, ckpt) = grads
    assert loss_plain == pytest.approx(loss_ckpt, abs=1e-6)
    assert plain.keys() == ckpt.keys()
    for name in plain:
        torch.testing.assert_close(ckpt[name], plain[name], rtol=1e-5, atol=1e-7, msg=name)


def test_activation_checkpointing_recomputes_blocks_in_backward():
    """The flag really routes blocks through torch.utils.checkpoint (else the test above
    would pass trivially)."""
    calls = []
    model = _tiny(activation_checkpointing=True)
    for block in model.blocks:
        block.register_forward_pre_hook(lambda *_: calls.append(1))
    inputs = torch.randint(64, (2, 16))
    model(inputs, inputs).backward()
    # Each block runs forward twice: once in forward, once recomputed in backward.
    assert len(calls) == 2 * PRESETS["tiny"]["n_layer"]


def test_weights_are_tied_and_loss_starts_near_uniform():
    model = _tiny()
    assert model.lm_head.weight is model.wte.weight
    inputs, targets = torch.randint(64, (2, 8, 16), generator=torch.Generator().manual_seed(2))
    assert model(inputs, targets).item() == pytest.approx(
        torch.log(torch.tensor(64.0)).item(), abs=0.3
    )


def _loss_at_first_position(model, inputs):
    targets = torch.full_like(inputs, -100)  # -100: ignored; only position 0 counts
    targets[:, 0] = 5
    return model(inputs, targets).item()


def test_encoder_preset_attends_both_ways_and_the_decoder_only_backwards():
    inputs = torch.randint(64, (1, 16), generator=torch.Generator().manual_seed(3))
    changed_last = inputs.clone()
    changed_last[0, -1] = (changed_last[0, -1] + 1) % 64
    for preset, sees_future in (("bert-tiny", True), ("tiny", False)):
        torch.manual_seed(0)
        model = build_gpt(preset, vocab_size=64, seq_len=16).eval()
        before = _loss_at_first_position(model, inputs)
        after = _loss_at_first_position(model, changed_last)
        assert (before != after) is sees_future, preset


def test_encoder_has_one_more_token_for_the_mask():
    assert build_gpt("bert-tiny", vocab_size=64, seq_len=16).wte.num_embeddings == 65
    assert mask_token_id(64) == 64
