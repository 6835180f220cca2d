"""Side by side: the trainer's DeepSpeed engine vs. a plain PyTorch loop, same model and data.

One process, one device, both loops in the same run, timed in alternating rounds so that
they share the machine's state. Reports tokens/s of each and the ratio DeepSpeed/PyTorch.

    # CPU, tiny model (a minute):
    python -m bench.trainer_vs_torch
    # GPU, the 350M preset in bf16 with ZeRO-2:
    python -m bench.trainer_vs_torch --preset gpt-350m --bf16 --zero-stage 2 \\
        --micro-batch 8 --seq-len 1024 --steps 30

The DeepSpeed side is built by the trainer's own code (training.engine), so it measures
what `python -m training` runs. The PyTorch side is the usual idiom: AdamW (fused on GPU),
autocast for bf16, the same clipping and learning rate.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from torch.utils.data import default_collate

from bench.single import init_single_process
from training.components import build_model
from training.data import SyntheticSequences
from training.engine import build_engine, param_groups, seed_everything
from training.metrics import mfu, peak_tflops
from training.spec.config import load_config, validate
from training.trainer import flops_per_token


def main() -> None:
    args = _parser().parse_args()
    on_gpu = torch.cuda.is_available()
    device = torch.device("cuda", 0) if on_gpu else torch.device("cpu")
    config = load_config(
        None,
        [
            f"model.preset={args.preset}",
            f"data.seq_len={args.seq_len}",
            f"data.vocab_size={args.vocab}",
            f"train.micro_batch_size={args.micro_batch}",
            "train.gradient_accumulation_steps=1",
            f"train.steps={args.steps + args.warmup}",
            f"zero.stage={args.zero_stage}",
            f"precision.bf16={str(args.bf16).lower()}",
            f"model.activation_checkpointing={str(args.activation_checkpointing).lower()}",
            "scheduler.kind=constant",
            "scheduler.warmup_steps=1",
        ],
        env={},
    )
    batch = validate(config, world_size=1)
    data = SyntheticSequences(
        vocab_size=config.vocab_size, seq_len=args.seq_len, num_samples=10**6, seed=0
    )
    micro = args.micro_batch
    batches = [
        [t.to(device) for t in default_collate([data[i * micro + j] for j in range(micro)])]
        for i in range(args.steps + args.warmup)
    ]

    seed_everything(config.run.seed)  # the weights build_engine starts from too
    plain = build_model(config).to(device)
    flops = flops_per_token(plain, args.seq_len)
    init_single_process(on_gpu)
    engine = build_engine(config, batch, on_gpu=on_gpu)
    steps = {
        "pytorch": _pytorch_step(plain, args, config, on_gpu),
        "deepspeed": _deepspeed_step(engine),
    }
    for step in steps.values():
        for inputs, targets in batches[: args.warmup]:
            step(inputs, targets)
    # Alternate timed rounds, so that a change in the machine's load (other jobs,
    # clocks) hits both loops alike instead of whichever ran second.
    seconds = dict.fromkeys(steps, 0.0)
    timed = batches[args.warmup :]
    for round_ in range(args.rounds):
        chunk = timed[round_ :: args.rounds]
        for name, step in steps.items():
            seconds[name] += _timed(step, chunk, on_gpu)

    tokens = args.micro_batch * args.seq_len * args.steps
    report = {
        "preset": args.preset,
        "device": torch.cuda.get_device_name(0) if on_gpu else "cpu",
        "bf16": args.bf16,
        "zero_stage": args.zero_stage,
        "micro_batch": args.micro_batch,
        "seq_len": args.seq_len,
        "timed_steps": args.steps,
        "rounds": args.rounds,
    }
    # MFU against the GPU's dense peak (training/gpu_peaks.toml); None on CPU or an unknown GPU.
    peak = peak_tflops(report["device"] if on_gpu else None, bf16=args.bf16)
    for name, took in seconds.items():
        report[f"{name}_tokens_per_s"] = tokens / took
        report[f"{name}_tflops"] = flops * tokens / took / 1e12
        report[f"{name}_mfu"] = mfu(flops, tokens / took, peak)
    report["tokens_per_s_ratio_deepspeed_over_pytorch"] = seconds["pytorch"] / seconds["deepspeed"]
    print(
        f"{args.preset} on {report['device']}: PyTorch {report['pytorch_tokens_per_s']:,.0f} "
        f"tokens/s, DeepSpeed ZeRO-{args.zero_stage} {report['deepspeed_tokens_per_s']:,.0f} "
        f"tokens/s, ratio {report['tokens_per_s_ratio_deepspeed_over_pytorch']:.2f}"
    )
    print(json.dumps(report))
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(report, handle, indent=1)


def _pytorch_step(model, args, config, on_gpu):
    optimizer = torch.optim.AdamW(
        param_groups(model, config.optimizer.weight_decay),
        lr=config.optimizer.lr,
        betas=config.optimizer.betas,
        eps=config.optimizer.eps,
        fused=on_gpu,
    )
    autocast = torch.autocast("cuda" if on_gpu else "cpu", dtype=torch.bfloat16, enabled=args.bf16)

    def step(inputs, targets):
        with autocast:
            loss = model(inputs, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.train.gradient_clipping)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def _deepspeed_step(engine):
    def step(inputs, targets):
        loss = engine(inputs, targets)
        engine.backward(loss)
        engine.step()

    return step


def _timed(step, batches, on_gpu: bool) -> float:
    _sync(on_gpu)
    started = time.perf_counter()
    for inputs, targets in batches:
        step(inputs, targets)
    _sync(on_gpu)
    return time.perf_counter() - started


def _sync(on_gpu: bool) -> None:
    if on_gpu:
        torch.cuda.synchronize()


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="tiny", help="tiny, gpt-124m, gpt-350m, gpt-1.3b")
    p.add_argument("--bf16", action="store_true")
    p.add_argument("--zero-stage", type=int, default=2)
    p.add_argument("--activation-checkpointing", action="store_true")
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--vocab", type=int, default=50304)
    p.add_argument("--steps", type=int, default=20, help="timed steps")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first, for each loop")
    p.add_argument("--rounds", type=int, default=3, help="alternating timed rounds")
    p.add_argument("--out", help="also write the JSON report here")
    return p


if __name__ == "__main__":
    main()
