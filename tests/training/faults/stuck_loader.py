"""A data.builder whose DataLoader worker stops for good on one rank (a deadlocked decoder, a
read from a hung network mount), after fetching some items."""

from __future__ import annotations

import os
import time

from training.data import SyntheticSequences


class StuckLoader(SyntheticSequences):
    def __init__(self, stuck_rank: int, stuck_after: int, **kwargs):
        super().__init__(**kwargs)
        self.stuck_rank, self.stuck_after = stuck_rank, stuck_after
        self.fetched = 0  # in the worker process that fetches (each has its own copy)

    def __getitem__(self, index: int):
        self.fetched += 1
        if os.environ.get("RANK") == str(self.stuck_rank) and self.fetched > self.stuck_after:
            wait_forever_in_the_loader()
        return super().__getitem__(index)


def wait_forever_in_the_loader() -> None:
    while True:
        time.sleep(3600)


def build(
    *, stuck_rank: int, stuck_after: int, seq_len: int, seed: int, vocab_size: int
) -> StuckLoader:
    return StuckLoader(
        stuck_rank, stuck_after, vocab_size=vocab_size, seq_len=seq_len, num_samples=120, seed=seed
    )
