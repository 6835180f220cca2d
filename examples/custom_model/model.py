"""A small LSTM language model: any nn.Module works if forward(inputs, targets) returns the loss."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


class LSTMLanguageModel(nn.Module):
    def __init__(self, *, vocab_size: int, hidden_size: int, num_layers: int):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, hidden_size)
        self.lstm = nn.LSTM(hidden_size, hidden_size, num_layers=num_layers, batch_first=True)
        self.head = nn.Linear(hidden_size, vocab_size)

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        hidden, _ = self.lstm(self.embed(inputs))
        logits = self.head(hidden)
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def build(*, vocab_size: int, seq_len: int, hidden_size: int = 64, num_layers: int = 1):
    """Called with `model.options` from the config, plus the data's vocab_size and seq_len."""
    return LSTMLanguageModel(vocab_size=vocab_size, hidden_size=hidden_size, num_layers=num_layers)
