"""Random-number-generator state for checkpoints: python, numpy, torch CPU and CUDA.

DeepSpeed keeps only rank 0's client_state, so every rank's state is gathered into one
list there, and each rank takes its own entry back on resume.
"""

from __future__ import annotations

import random

import numpy as np
import torch
import torch.distributed as dist


def capture() -> dict:
    """This process's generator states, as picklable builtins and tensors."""
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch_cpu": torch.get_rng_state(),
        "torch_cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def restore(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch_cpu"])
    if torch.cuda.is_available() and state["torch_cuda"]:
        torch.cuda.set_rng_state_all(state["torch_cuda"])


def gather_all_ranks() -> list[dict]:
    """Every rank's state, indexed by rank (a collective: every rank calls it)."""
    mine = capture()
    if not (dist.is_available() and dist.is_initialized()):
        return [mine]
    states: list[dict | None] = [None] * dist.get_world_size()
    dist.all_gather_object(states, mine)
    return states  # type: ignore[return-value]


def restore_for_rank(states: list[dict], rank: int) -> bool:
    """Restore this rank's saved state; False when the checkpoint had fewer ranks."""
    if rank >= len(states):
        return False
    restore(states[rank])
    return True
