"""Top-1 accuracy and loss on the held-out split, over all ranks together.

Each rank scores every world_size-th sample of the split, in order; the counts are summed
over the ranks, so the figures cover the whole split whatever the world size (at ZeRO-3,
where each forward gathers parameters with the other ranks, every rank scores the same
number: the last len % world_size samples are left out; under Ulysses sequence parallelism,
whose attention is built for whole micro-batches, a last partial batch is left out too).
The model needs a
`score(*batch)` method giving [summed loss, correct, predictions] (the vision presets and
Hugging Face models have one: an image is one prediction, a language model's target
token is one).

BatchNorm's running statistics are the only state evaluation reads that training does not
keep equal on every rank; they are taken from rank 0 first, as DistributedDataParallel
does before each forward, so that a resumed run (which restores rank 0's) scores the same.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset

from training.data import worker_processes


class Evaluator:
    def __init__(
        self,
        dataset: Dataset,
        *,
        rank: int,
        world_size: int,
        batch_size: int,
        num_workers: int,
        device: torch.device,
        same_count_per_rank: bool = False,
        whole_batches: bool = False,
    ):
        end = len(dataset) - len(dataset) % world_size if same_count_per_rank else len(dataset)
        indices = list(range(rank, end, world_size))
        self.loader = DataLoader(
            dataset,
            batch_size=batch_size,
            sampler=indices,
            drop_last=whole_batches,
            **worker_processes(num_workers, dataset),
            pin_memory=device.type == "cuda",
        )
        self.device = device

    @torch.no_grad()
    def evaluate(self, model: nn.Module) -> dict[str, float]:
        """{"val_loss", "val_accuracy"} of `model` on the split; a collective."""
        for buffer in model.buffers():
            dist.broadcast(buffer, src=0)
        was_training = model.training
        model.eval()
        totals = torch.zeros(3, dtype=torch.float64, device=self.device)  # loss, correct, count
        try:
            for batch in self.loader:
                tensors = (t.to(self.device, non_blocking=True) for t in batch)
                totals += model.score(*tensors).to(totals.dtype)
        finally:
            model.train(was_training)
        dist.all_reduce(totals)
        loss, correct, count = totals.tolist()
        return {"val_loss": loss / count, "val_accuracy": correct / count}
