"""A model whose forward raises CUDA's out-of-memory error at its N-th call, as a GPU does
when a batch does not fit (torch.cuda.OutOfMemoryError is constructible without a GPU)."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


class RunsOutOfMemory(nn.Module):
    def __init__(self, *, vocab_size: int, fail_at_call: int):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, 16)
        self.head = nn.Linear(16, vocab_size)
        self.fail_at_call, self.calls = fail_at_call, 0

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls == self.fail_at_call:
            raise torch.cuda.OutOfMemoryError(
                "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity "
                "of 15.77 GiB of which 1.02 GiB is free."
            )
        logits = self.head(self.embed(inputs))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def build(*, vocab_size: int, seq_len: int, fail_at_call: int = 1) -> RunsOutOfMemory:
    return RunsOutOfMemory(vocab_size=vocab_size, fail_at_call=fail_at_call)
