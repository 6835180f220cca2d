"""A distributed sampler whose position survives a restart exactly.

Each epoch is one seeded permutation of the dataset; rank r takes every world_size-th
index starting at r. The trainer calls `advance(n)` after it has *used* n samples, so the
saved position counts consumed samples, not ones a DataLoader worker prefetched.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import DataLoader, Sampler


class ResumableDistributedSampler(Sampler[int]):
    def __init__(self, dataset_len: int, *, rank: int, world_size: int, seed: int):
        if dataset_len < world_size:
            raise ValueError(
                f"the dataset has {dataset_len} samples, fewer than the {world_size} ranks"
            )
        self.dataset_len, self.rank, self.world_size, self.seed = (
            dataset_len,
            rank,
            world_size,
            seed,
        )
        self.epoch = 0
        self.consumed = 0  # samples this rank has used in the current epoch

    @property
    def per_rank(self) -> int:
        # Drop the tail so that every rank sees the same number of samples.
        return self.dataset_len // self.world_size

    def _epoch_indices(self) -> torch.Tensor:
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        order = torch.randperm(self.dataset_len, generator=generator)
        return order[self.rank : self.per_rank * self.world_size : self.world_size]

    def __iter__(self) -> Iterator[int]:
        """The rest of the current epoch, from the first sample not yet consumed."""
        return iter(self._epoch_indices()[self.consumed :].tolist())

    def __len__(self) -> int:
        return self.per_rank - self.consumed

    def advance(self, samples: int) -> None:
        self.consumed += samples

    def next_epoch(self) -> None:
        self.epoch += 1
        self.consumed = 0

    def state_dict(self) -> dict[str, int]:
        return {
            "epoch": self.epoch,
            "consumed": self.consumed,
            "world_size": self.world_size,
            "seed": self.seed,
        }

    def load_state_dict(self, state: dict[str, int]) -> None:
        if state["seed"] != self.seed:
            raise ValueError(
                f"the checkpoint's data order was drawn with run.seed = {state['seed']}, "
                f"this run has {self.seed}: resume with the same seed"
            )
        self.epoch = state["epoch"]
        # Keep the global position when the world size changed: samples consumed by all
        # ranks together stay consumed.
        self.consumed = state["consumed"] * state["world_size"] // self.world_size


def micro_batches(loader: DataLoader, sampler: ResumableDistributedSampler) -> Iterator:
    """Micro-batches forever, epoch after epoch, counting what the loop has consumed."""
    while True:
        if hasattr(loader.dataset, "set_epoch"):  # augmentation drawn per epoch
            loader.dataset.set_epoch(sampler.epoch)
        for batch in loader:  # (inputs, targets, ...) tensors of one micro-batch
            sampler.advance(len(batch[0]))
            yield batch
        sampler.next_epoch()
