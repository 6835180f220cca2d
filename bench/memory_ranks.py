"""Worker: per-rank memory of parameters, gradients and optimizer state for each ZeRO
setup, from the engine's actual tensors. Launched on N ranks by bench/memory.py.

For each setup, one engine at a time (built as the trainer builds it, bf16): every live
tensor's storage is counted (deduplicated) before the engine exists, after one backward,
and the categories are read from the engine: parameters (under ZeRO-3 each rank's
partition, `ds_tensor`), optimizer state (the fp32 master partitions and Adam's moments).
Gradients are what else the backward left alive: gradient partitions and DeepSpeed's
reduce buffers. Rank 0 writes the figures of every rank as JSON.
"""

from __future__ import annotations

import argparse
import gc
import json
from pathlib import Path

import deepspeed
import torch
import torch.distributed as dist

from bench.launch import exit_worker
from training.engine import build_engine
from training.spec.config import add_overrides_argument, load_config, validate

SETUPS = {
    "ZeRO-0": ("zero.stage=0",),
    "ZeRO-1": ("zero.stage=1",),
    "ZeRO-2": ("zero.stage=2",),
    "ZeRO-3": ("zero.stage=3",),
    "ZeRO-2 + optimizer offload": ("zero.stage=2", "zero.offload_optimizer=true"),
    "ZeRO-3 + param and optimizer offload": (
        "zero.stage=3",
        "zero.offload_optimizer=true",
        "zero.offload_param=true",
    ),
}
# The fp32 master copies each ZeRO optimizer keeps (stage 0 bf16: BF16_Optimizer).
MASTER_ATTRIBUTES = (
    "single_partition_of_fp32_groups",
    "fp32_partitioned_groups_flat",
    "fp32_groups_flat_partition",
)


def main() -> None:
    args = _parser().parse_args()
    deepspeed.init_distributed(dist_backend="gloo")
    world = dist.get_world_size()
    results = {}
    for name, setup in SETUPS.items():
        config = load_config(None, [*args.overrides, *setup, "precision.bf16=true"], env={})
        results[name] = _measure(config, validate(config, world))
    gathered = [None] * world
    dist.all_gather_object(gathered, results)
    if dist.get_rank() == 0:
        Path(args.out).write_text(json.dumps({"world_size": world, "ranks": gathered}))


def _measure(config, batch) -> dict:
    gc.collect()
    before = _live_bytes()
    engine = build_engine(config, batch, on_gpu=False)
    # parameters() yields a tied weight once; a ZeRO-3 partition keeps its full size in ds_numel.
    num_params = sum(getattr(p, "ds_numel", p.numel()) for p in engine.module.parameters())
    seq, micro = config.data.seq_len, batch.micro_batch_size
    tokens = torch.randint(config.vocab_size, (micro, seq + 1))
    # Step once so that Adam's moments exist, then measure at the next backward's end,
    # where parameters, gradients and optimizer state are all alive.
    for _ in range(2):
        loss = engine(tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous())
        engine.backward(loss)
        if _ == 0:
            engine.step()
    del loss
    gc.collect()
    total = _live_bytes() - before
    params = _bytes(getattr(p, "ds_tensor", p) for p in engine.module.parameters())
    optimizer = _optimizer_bytes(engine.optimizer)
    figures = {
        "params": params,
        "optimizer": optimizer,
        "grads_and_buffers": total - params - optimizer,
        "total": total,
        "num_params": num_params,
    }
    engine.step()
    engine.destroy()
    del engine
    gc.collect()
    return figures


def _optimizer_bytes(wrapper) -> int:
    inner = getattr(wrapper, "optimizer", wrapper)
    tensors = [t for state in inner.state.values() for t in state.values() if torch.is_tensor(t)]
    for attribute in MASTER_ATTRIBUTES:
        for item in getattr(wrapper, attribute, None) or []:
            tensors += item if isinstance(item, list) else [item]
    return _bytes(tensors)


def _live_bytes() -> int:
    tensors = []
    for obj in gc.get_objects():
        try:
            if torch.is_tensor(obj) and not obj.is_meta:
                tensors.append(obj)
        except Exception:
            continue
    return _bytes(tensors)


def _bytes(tensors) -> int:
    storages = {}
    for tensor in tensors:
        if tensor is None or not torch.is_tensor(tensor) or tensor.is_meta:
            continue
        storage = tensor.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_overrides_argument(p)
    p.add_argument("--out", required=True)
    return p


if __name__ == "__main__":
    main()
    exit_worker()
