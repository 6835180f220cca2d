"""Top-1 accuracy and loss on the held-out split, over all ranks together.

Each rank scores every world_size-th sample of the split, in order; the counts are summed
over the ranks, so the figures cover the whole split whatever the world size. The model
needs a `logits(inputs)` method (the vision presets have one).

BatchNorm's running statistics are the only state evaluation reads that training does not
keep equal on every rank; they are taken from rank 0 first, as DistributedDataParallel
does before each forward, so that a resumed run (which restores rank 0's) scores the same.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F
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
    ):
        indices = list(range(rank, len(dataset), world_size))
        self.loader = DataLoader(
            dataset,
            batch_size=batch_size,
            sampler=indices,
            **worker_processes(num_workers),
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
            for images, labels in self.loader:
                images = images.to(self.device, non_blocking=True)
                labels = labels.to(self.device, non_blocking=True)
                logits = model.logits(images).float()
                totals[0] += F.cross_entropy(logits, labels, reduction="sum")
                totals[1] += (logits.argmax(dim=1) == labels).sum()
                totals[2] += len(labels)
        finally:
            model.train(was_training)
        dist.all_reduce(totals)
        loss, correct, count = totals.tolist()
        return {"val_loss": loss / count, "val_accuracy": correct / count}
