"""A tiny real DeepSpeed engine for checkpoint tests (CPU, torch Adam, ZeRO on gloo), built
by the trainer's recipe (training.engine.initialize) around a small model of its own."""

from __future__ import annotations

import deepspeed
import torch
import torch.distributed as dist

from training.engine import initialize

FEATURES = 8


def build_engine(
    *,
    zero_stage: int = 2,
    seed: int = 0,
    lr: float = 1e-2,
    load_universal: bool = False,
    bf16: bool = False,
):
    config = {
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "Adam", "params": {"lr": lr, "torch_adam": True}},
        "zero_optimization": {"stage": zero_stage},
        "bf16": {"enabled": bf16},
        "steps_per_print": 10**9,
    }
    return initialize(
        lambda: torch.nn.Sequential(
            torch.nn.Linear(FEATURES, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)
        ),
        config,
        seed=seed,
        load_universal=load_universal,
    )


def batch(step: int, rank: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch a rank trains on at ``step``: the same on every run."""
    rank = dist.get_rank() if rank is None else rank
    generator = torch.Generator().manual_seed(1000 * step + rank)
    inputs = torch.randn(4, FEATURES, generator=generator)
    return inputs, inputs.sum(dim=1, keepdim=True)


def train_step(engine, step: int) -> float:
    inputs, targets = batch(step)
    dtype = torch.bfloat16 if engine.bfloat16_enabled() else torch.float32
    loss = torch.nn.functional.mse_loss(engine(inputs.to(dtype)).float(), targets)
    engine.backward(loss)
    engine.step()
    return loss.item()


def weights(engine) -> dict[str, torch.Tensor]:
    """Full copies of the weights (gathered first under ZeRO-3, a no-op otherwise)."""
    with deepspeed.zero.GatheredParameters(list(engine.module.parameters())):
        return {name: p.detach().clone() for name, p in engine.module.named_parameters()}
