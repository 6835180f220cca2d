"""At ZeRO-3 a Hugging Face model is built partitioned and its weights loaded one module
at a time (transformers' DeepSpeed integration): measured on two real gloo ranks, no rank
ever holds more than its share of the parameters plus one module's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.training.multirank import torchrun
from tests.training.tiny_hf import (
    HIDDEN,
    INTERMEDIATE,
    OTHER_TENSORS,
    TENSORS_PER_LAYER,
    llama_parameters,
    save_model,
)

pytestmark = [
    pytest.mark.multiprocess,
    # Measured 31 s on 2 cores under a load of about 8; the two ranks' start (torch,
    # transformers, DeepSpeed) is most of it.
    pytest.mark.slow(
        reason="two gloo ranks build a tiny Llama at ZeRO-3, then rank 0 once more whole",
        seconds=60,
    ),
]

LAYERS = 8  # so that one module is a small part of the model


def test_no_rank_holds_more_than_its_share_and_one_module(tmp_path, tiny_hf):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_hf.model)
    model = save_model(tmp_path / "model", tokenizer, num_hidden_layers=LAYERS)
    job = torchrun(
        Path(__file__).with_name("partitioned_init_worker.py"), 2, str(tmp_path), str(model)
    )
    assert job.wait(timeout=300) == 0
    vocab = len(tokenizer)
    full = llama_parameters(vocab, layers=LAYERS)
    # The largest single module: the token table or the output layer (vocab x hidden),
    # else one MLP projection (hidden x intermediate).
    largest = max(vocab * HIDDEN, HIDDEN * INTERMEDIATE)
    ranks = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert all(r["full"] == full for r in ranks)
    # The measure sees a whole model when it is built whole...
    assert ranks[0]["whole_peak"] >= full
    # ...and, partitioned, at most half of it plus the module being loaded (a tensor's
    # share is rounded up: at most one element more per tensor).
    tensors = TENSORS_PER_LAYER * LAYERS + OTHER_TENSORS
    for r in ranks:
        assert r["partitioned_peak"] <= full / 2 + tensors + largest, r
