"""One-process DeepSpeed engines for benchmarks that need no launcher (rank 0 of 1)."""

from __future__ import annotations

import os

import deepspeed
import torch

from bench.launch import free_port
from training.engine import build_engine
from training.spec.config import load_config, validate


def init_single_process(on_gpu: bool) -> None:
    """deepspeed.init_distributed as a launcher would, for a world of one."""
    if torch.distributed.is_initialized():
        return
    for name, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"}.items():
        os.environ.setdefault(name, value)
    deepspeed.init_distributed(
        dist_backend="nccl" if on_gpu else "gloo",
        init_method=f"tcp://127.0.0.1:{free_port()}",
        rank=0,
        world_size=1,
        auto_mpi_discovery=False,
        verbose=False,
    )


def trainer_engine(overrides: list[str] | tuple[str, ...]):
    """(engine, config) built as the trainer builds them, for the config the overrides give."""
    on_gpu = torch.cuda.is_available()
    init_single_process(on_gpu)
    config = load_config(None, overrides, env={})
    batch = validate(config, world_size=1)
    return build_engine(config, batch, on_gpu=on_gpu), config


def train_step(engine, config) -> None:
    """One step on random tokens of the config's shape."""
    micro, seq = engine.train_micro_batch_size_per_gpu(), config.data.seq_len
    tokens = torch.randint(config.vocab_size, (micro, seq + 1), device=engine.device)
    engine.backward(engine(tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()))
    engine.step()
