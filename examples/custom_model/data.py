"""Repeated motifs: each sequence repeats a random 4-token motif.

Any torch Dataset works if each item is an (inputs, targets) pair of LongTensors of
length seq_len.
"""

from __future__ import annotations

import torch
from torch.utils.data import Dataset


class RepeatedMotifs(Dataset):
    def __init__(
        self, *, seq_len: int, vocab_size: int, motif_len: int, num_samples: int, seed: int
    ):
        self.seq_len, self.vocab_size, self.motif_len = seq_len, vocab_size, motif_len
        self.num_samples, self.seed = num_samples, seed

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        motif = torch.randint(self.vocab_size, (self.motif_len,), generator=generator)
        tokens = motif.repeat(self.seq_len // self.motif_len + 2)[: self.seq_len + 1]
        return tokens[:-1], tokens[1:]


def build(*, seq_len: int, seed: int, vocab_size: int, motif_len: int = 4, num_samples: int = 4096):
    """Called with `data.options` from the config, plus data.seq_len, run.seed, data.vocab_size."""
    return RepeatedMotifs(
        seq_len=seq_len,
        vocab_size=vocab_size,
        motif_len=motif_len,
        num_samples=num_samples,
        seed=seed,
    )
