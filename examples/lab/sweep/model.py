"""A small MLP language model over a window of tokens: any nn.Module whose
forward(inputs, targets) returns the loss is a model the trainer can train."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


class WindowModel(nn.Module):
    def __init__(self, *, vocab_size: int, hidden_size: int):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, hidden_size)
        self.mix = nn.Sequential(nn.Linear(hidden_size, hidden_size), nn.GELU())
        self.head = nn.Linear(hidden_size, vocab_size)

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = self.head(self.mix(self.embed(inputs)))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def build(*, vocab_size: int, seq_len: int, hidden_size: int = 128):
    """Called with `model.options` from the config, plus the data's vocab_size and seq_len."""
    return WindowModel(vocab_size=vocab_size, hidden_size=hidden_size)
