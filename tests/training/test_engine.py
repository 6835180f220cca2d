"""training.engine.build_engine: the trainer's engine, built the same for every caller."""

from __future__ import annotations

import pytest
import torch

from training.engine import build_engine
from training.spec.config import load_config, validate

# The demo job's tiny GPT: 2 blocks, n_embd 64, vocab 128, seq_len 64; ZeRO-0 keeps the
# optimizer's own parameter groups, unflattened.
TINY = ["zero.stage=0", "optimizer.weight_decay=0.1", "train.micro_batch_size=2"]


def _engine(*overrides: str):
    config = load_config(None, [*TINY, *overrides], env={})
    return build_engine(config, validate(config, world_size=1), on_gpu=False)


def _weights(engine) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in engine.module.named_parameters()}


def test_every_build_starts_from_the_run_seeds_weights(single_rank):
    first, again, other = _engine("run.seed=3"), _engine("run.seed=3"), _engine("run.seed=4")
    a, b, c = _weights(first), _weights(again), _weights(other)
    assert a.keys() == b.keys() and all(torch.equal(a[name], b[name]) for name in a)
    assert not torch.equal(a["wte.weight"], c["wte.weight"])


@pytest.mark.slow(reason="a real DeepSpeed engine trained for steps", seconds=80)
def test_weight_decay_falls_on_matrices_only(single_rank):
    groups = _engine().optimizer.param_groups
    # Matrices: token and position embeddings (the output layer is tied to the first),
    # and per block qkv, attention projection, MLP in and out: 2 + 2 * 4.
    # The rest: per block two LayerNorms (weight, bias) and four Linear biases, and the
    # final LayerNorm: 2 * (4 + 4) + 2.
    assert [(len(g["params"]), g["weight_decay"]) for g in groups] == [(10, 0.1), (18, 0.0)]
    assert all(p.dim() >= 2 for p in groups[0]["params"])
