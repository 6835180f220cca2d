"""Worker: a hand-written DeepSpeed loop and a plain PyTorch (DDP) loop on the trainer's
model, data and DeepSpeed config, and the cost of each per-step extra the trainer adds.

Launched on N ranks by bench/overhead.py (`torch.distributed.run -m bench.loops`). Both
loops run `--window` steps per round, rounds interleaved; rank 0 writes each loop's
seconds per window (the first round, a warm-up, left out) as JSON.

The DeepSpeed loop is DeepSpeedExamples' shape (HelloDeepSpeed): deepspeed.initialize,
then forward, engine.backward, engine.step. What training/trainer.py does per step that
this loop does not is timed call by call, with the trainer's own functions, between
training steps (so each call finds the engine's state as the trainer's would):

- stop_flag: StopFlag.should_stop(), an all-reduce of the stop flag and a host sync;
- loss_window: the loss averaged over ranks, once per logging.every_steps (an all-reduce
  and a host sync);
- sampler: a micro-batch from the trainer's resumable sampler and its consumed-samples
  count, minus one from torch's DistributedSampler.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import statistics
import time
from pathlib import Path

import deepspeed
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

from bench.launch import exit_worker
from bench.measure import interleaved
from training.components import build_dataset, build_model
from training.engine import build_engine, mean_over_ranks, param_groups, seed_everything
from training.interrupt import StopFlag
from training.sampler import ResumableDistributedSampler, micro_batches
from training.spec.config import add_overrides_argument, load_config, validate


def main() -> None:
    args = _parser().parse_args()
    config = load_config(None, args.overrides, env={})
    world = int(os.environ["WORLD_SIZE"])
    batch = validate(config, world)
    on_gpu = torch.cuda.is_available()
    if on_gpu:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        torch.backends.cuda.matmul.allow_tf32 = True
    deepspeed.init_distributed(dist_backend="nccl" if on_gpu else "gloo")
    rank = dist.get_rank()
    device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
    dataset = build_dataset(config)
    micro = batch.micro_batch_size

    def plain_batches():
        sampler = DistributedSampler(dataset, seed=config.run.seed, drop_last=True)
        loader = DataLoader(dataset, batch_size=micro, sampler=sampler, drop_last=True)
        for epoch in itertools.count():
            sampler.set_epoch(epoch)
            yield from loader

    resumable = ResumableDistributedSampler(
        len(dataset), rank=rank, world_size=world, seed=config.run.seed
    )
    trainer_batches = micro_batches(
        DataLoader(dataset, batch_size=micro, sampler=resumable, drop_last=True), resumable
    )

    engine = None
    if "deepspeed" in args.loops:
        engine = build_engine(config, batch, on_gpu=on_gpu)
    stop = StopFlag(spot_endpoint=None)
    loss_sum = torch.zeros((), device=device)
    every = config.logging.every_steps
    plain = plain_batches()
    accum = batch.gradient_accumulation_steps

    def deepspeed_steps(steps: int) -> None:
        for _ in range(steps):
            for _ in range(accum):
                inputs, targets = next(plain)
                loss = engine(inputs.to(device), targets.to(device))
                engine.backward(loss)
                engine.step()
                loss_sum.add_(loss.detach().float())

    variants = {}
    if "deepspeed" in args.loops:
        variants["deepspeed"] = lambda: _timed(deepspeed_steps, args.window, on_gpu)
    if "pytorch" in args.loops:
        variants["pytorch"] = _pytorch_loop(config, batch, plain, device, on_gpu, args.window)
    seconds = interleaved(variants, args.rounds + 1)
    peak_gib = torch.cuda.max_memory_allocated() / 2**30 if on_gpu else None
    extras = (
        {}
        if engine is None
        else {
            "stop_flag": stop.should_stop,
            "loss_window": lambda: mean_over_ranks(loss_sum),
            "sampler": lambda: next(trainer_batches),
            "plain_sampler": lambda: next(plain),
        }
    )
    samples: dict[str, list[float]] = {name: [] for name in extras}
    for _ in range(args.calls if extras else 0):
        deepspeed_steps(1)
        for name, call in extras.items():
            dist.barrier()
            started = time.perf_counter()
            call()
            samples[name].append(time.perf_counter() - started)
    calls = {name: statistics.median(times) for name, times in samples.items() if times}
    if calls:
        calls["sampler"] -= calls.pop("plain_sampler")
    if rank == 0:
        tokens = batch.global_batch_size * config.data.seq_len * args.window
        report = {
            "window_steps": args.window,
            "tokens_per_window": tokens,
            "world_size": world,
            "seconds_per_window": {name: times[1:] for name, times in seconds.items()},
            "seconds_per_call": calls,
            "gpu_peak_allocated_gib": peak_gib,
            "calls_per_step": {"stop_flag": 1, "loss_window": 1 / every, "sampler": accum},
        }
        Path(args.out).write_text(json.dumps(report, indent=1))


def _pytorch_loop(config, batch, batches, device, on_gpu, window):
    """DDP, torch AdamW (fused on GPU), autocast for bf16, the same clipping."""
    seed_everything(config.run.seed)
    model = build_model(config).to(device)
    ddp = DistributedDataParallel(model, device_ids=[device.index] if on_gpu else None)
    opt = config.optimizer
    optimizer = torch.optim.AdamW(
        param_groups(model, opt.weight_decay),
        lr=opt.lr,
        betas=opt.betas,
        eps=opt.eps,
        fused=on_gpu,
    )
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=config.precision.bf16)
    accum = batch.gradient_accumulation_steps

    def steps(count: int) -> None:
        for _ in range(count):
            for micro in range(accum):
                inputs, targets = next(batches)
                context = ddp.no_sync() if micro < accum - 1 else contextlib.nullcontext()
                with context, autocast:
                    loss = ddp(inputs.to(device), targets.to(device)) / accum
                with context:
                    loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), config.train.gradient_clipping)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    return lambda: _timed(steps, window, on_gpu)


def _timed(work, steps: int, on_gpu: bool, **options) -> float:
    """Seconds for ``steps`` steps, every rank starting together."""
    if on_gpu:
        torch.cuda.synchronize()
    dist.barrier()
    started = time.perf_counter()
    work(steps, **options)
    if on_gpu:
        torch.cuda.synchronize()
    dist.barrier()
    return time.perf_counter() - started


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_overrides_argument(p)
    p.add_argument("--window", type=int, default=10, help="steps per variant per round")
    p.add_argument("--rounds", type=int, default=3, help="timed rounds (after one warm-up)")
    p.add_argument("--calls", type=int, default=30, help="timed calls of each extra")
    p.add_argument(
        "--loops",
        default="deepspeed,pytorch",
        help="which loops, comma-separated (one job each keeps their GPU memory apart)",
    )
    p.add_argument("--out", required=True)
    return p


if __name__ == "__main__":
    main()
    exit_worker()
