"""Worker: one layout's throughput and memory per rank on N ranks, for bench/layouts.py.

The engine is the trainer's (training.engine.build_engine, model.hf, synthetic tokens);
the ranks of a tensor or sequence group feed the same batches, as the trainer's sampler
does. After
warm-up steps, `steps` steps are timed; memory is the rank's model states once Adam's
moments exist: its parameters (its tensor slices, or its ZeRO-3 partition) and optimizer
state (fp32 master partitions and moments), counted as bench/memory_ranks.py counts them,
without DeepSpeed's fixed-size communication buffers, which on a small model would hide
the layout's difference. Rank 0 writes every rank's figures as JSON.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import deepspeed
import torch
import torch.distributed as dist

from bench.launch import exit_worker
from bench.memory_ranks import _bytes, _optimizer_bytes
from training.engine import build_engine
from training.inputs import JobInputs
from training.spec.config import add_overrides_argument, load_config, validate
from training.spec.parallel import layout


def main() -> None:
    args = _parser().parse_args()
    deepspeed.init_distributed(dist_backend="gloo")
    world, rank = dist.get_world_size(), dist.get_rank()
    config = load_config(args.config, args.overrides, env={})
    batch = validate(config, world)
    grid = layout(config, world)
    engine = build_engine(
        config, batch, on_gpu=False, inputs=JobInputs(model_folder=Path(config.model.hf))
    )
    # One stream per tensor or sequence group, whose ranks read the same batches.
    generator = torch.Generator().manual_seed(rank // (grid.tensor * grid.sequence))
    seq, micro = config.data.seq_len, batch.micro_batch_size
    tokens = [
        torch.randint(config.vocab_size, (micro, seq + 1), generator=generator)
        for _ in range(args.warmup + args.steps)
    ]
    for step, sample in enumerate(tokens):
        if step == args.warmup:
            dist.barrier()
            started = time.perf_counter()
        loss = engine(sample[:, :-1].contiguous(), sample[:, 1:].contiguous())
        engine.backward(loss)
        engine.step()
    dist.barrier()
    took = time.perf_counter() - started
    params = _bytes(getattr(p, "ds_tensor", p) for p in engine.module.parameters())
    states = params + _optimizer_bytes(engine.optimizer)
    figures = {"bytes": states, "seconds_per_step": took / args.steps}
    gathered = [None] * world
    dist.all_gather_object(gathered, figures)
    if rank == 0:
        tokens_per_step = batch.global_batch_size * seq
        Path(args.out).write_text(
            json.dumps(
                {
                    "layout": grid.describe(),
                    "tokens_per_s": tokens_per_step / max(r["seconds_per_step"] for r in gathered),
                    "bytes_per_rank": max(r["bytes"] for r in gathered),
                }
            )
        )


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", required=True)
    add_overrides_argument(p)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--out", required=True)
    return p


if __name__ == "__main__":
    main()
    exit_worker()
