"""A Hugging Face model: the trainer's engine against a plain PyTorch + transformers loop.

One process, the same Llama (built from a LlamaConfig and saved to a folder: nothing is
downloaded) and the same batches, the two loops timed in alternating rounds. The engine
is built by the trainer's own code (`model.hf` through training.engine.build_engine), so
it is what `python -m training` runs; the plain loop is transformers' model with AdamW
(fused on a GPU) and autocast for bf16, the loss computed as the trainer does.

On a CPU: a small Llama (5.3M parameters) in fp32 (the ratio shows the engine's per-step
cost). On a GPU:
Llama 3.2 1B's shape in bf16 with ZeRO-2 at sequence 2048, and the MFU of each loop against
the GPU's dense bf16 peak (training/gpu_peaks.toml).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import torch
from torch.nn import functional as F

from bench.measure import metric
from bench.single import init_single_process

TITLE = "Hugging Face model (Llama)"
# Llama 3.2 1B's shape (https://huggingface.co/meta-llama/Llama-3.2-1B, config.json): 1.24B
# parameters, the output layer tied to the token table.
SHAPES = {
    "small": {
        "hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 4,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 4096,
    },
    "1b": {
        "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
        "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
        "tie_word_embeddings": True,
    },
}  # fmt: skip


def run(quick: bool) -> dict:
    on_gpu = torch.cuda.is_available()
    size = "1b" if on_gpu else "small"
    seq, micro = (2048, 4) if on_gpu else (128, 8)
    steps, warmup, rounds = (6, 2, 2) if quick else (24, 3, 4)
    folder = Path(tempfile.mkdtemp(prefix="bench-hf-"))
    save_llama(folder, SHAPES[size], seq_len=seq, bf16=on_gpu)
    device = torch.device("cuda", 0) if on_gpu else torch.device("cpu")
    init_single_process(on_gpu)
    vocab = SHAPES[size]["vocab_size"]
    engine, config = trainer_engine(folder, seq=seq, micro=micro, vocab=vocab, bf16=on_gpu)
    plain = _PlainStep(folder, config, bf16=on_gpu, device=device)
    generator = torch.Generator().manual_seed(0)
    batches = [
        torch.randint(vocab, (micro, seq + 1), generator=generator).to(device)
        for _ in range(warmup + steps)
    ]

    def trainer_step(tokens):
        loss = engine(tokens[:, :-1], tokens[:, 1:])
        engine.backward(loss)
        engine.step()

    loops = {"trainer": trainer_step, "pytorch": plain}
    for step in loops.values():
        for tokens in batches[:warmup]:
            step(tokens)
    seconds = dict.fromkeys(loops, 0.0)
    timed = batches[warmup:]
    for round_ in range(rounds):
        for name in list(loops) if round_ % 2 == 0 else list(loops)[::-1]:
            seconds[name] += _timed(loops[name], timed[round_::rounds], on_gpu)
    tokens = micro * seq * steps
    rate = {name: tokens / took for name, took in seconds.items()}
    flops = engine.module.flops_per_token(seq)
    from training.metrics import mfu, peak_tflops

    peak = peak_tflops(torch.cuda.get_device_name(0) if on_gpu else None, bf16=on_gpu)
    metrics = [
        metric(
            f"trainer engine, Llama {size}, ZeRO-2",
            rate["trainer"],
            "tokens/s",
            baseline=rate["pytorch"],
            baseline_label="plain PyTorch + transformers loop",
            target=">= 0.95",
        )
    ]
    if peak is not None:
        for name, label in (("trainer", "trainer engine MFU"), ("pytorch", "plain loop MFU")):
            metrics.append(
                metric(f"{label}, Llama 1B bf16", mfu(flops, rate[name], peak), "MFU",
                       target=">= 0.5" if name == "trainer" else None)
            )  # fmt: skip
    parameters = sum(p.numel() for p in plain.model.parameters())
    return {
        "baseline": "a plain PyTorch + transformers loop on the same model and batches",
        "setup": (
            f"Llama {size} ({parameters / 1e6:.1f}M parameters, built from a LlamaConfig), "
            f"{'bf16' if on_gpu else 'fp32'}, micro batch {micro} x {seq} tokens, one "
            f"{'GPU' if on_gpu else 'CPU process'}; {steps} timed steps per loop in {rounds} "
            f"alternating rounds after {warmup} warm-up steps"
        ),
        "metrics": metrics,
        "tokens_per_s": rate,
        "flops_per_token": flops,
        "notes": [
            "on one device ZeRO-2 partitions nothing: the ratio is the engine's per-step "
            "cost (or gain, from its fused optimizer) on a transformers model",
        ],
    }


def save_llama(folder: Path, shape: dict, *, seq_len: int, bf16: bool) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(**shape, max_position_embeddings=seq_len)
    model = LlamaForCausalLM(config)
    model.to(torch.bfloat16 if bf16 else torch.float32).save_pretrained(folder)


def trainer_engine(folder: Path, *, seq: int, micro: int, vocab: int, bf16: bool):
    """The engine `python -m training` builds for the model in `folder` (one rank)."""
    from training.engine import build_engine
    from training.inputs import JobInputs
    from training.spec.config import load_config, validate

    job = folder / "job.toml"
    job.write_text(
        f'[model]\nhf = "{folder}"\n'
        f'[data]\nkind = "synthetic"\nseq_len = {seq}\nvocab_size = {vocab}\n'
        f"[train]\nmicro_batch_size = {micro}\n"
        "gradient_accumulation_steps = 1\n"
        '[scheduler]\nkind = "constant"\nwarmup_steps = 1\n'
        f"[zero]\nstage = 2\n[precision]\nbf16 = {str(bf16).lower()}\n"
    )
    config = load_config(job, env={})
    engine = build_engine(
        config,
        validate(config, world_size=1),
        on_gpu=torch.cuda.is_available(),
        inputs=JobInputs(model_folder=folder),
    )
    return engine, config


class _PlainStep:
    """transformers' model, AdamW with weight decay on matrices, autocast for bf16."""

    def __init__(self, folder: Path, config, *, bf16: bool, device: torch.device):
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
        self.model.to(device).train()
        params = list(self.model.parameters())
        self.optimizer = torch.optim.AdamW(
            [
                {"params": [p for p in params if p.ndim >= 2], "weight_decay": 0.1},
                {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
            ],
            lr=config.optimizer.lr,
            betas=config.optimizer.betas,
            fused=device.type == "cuda",
        )
        self.autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16)
        self.clip = config.train.gradient_clipping

    def __call__(self, tokens: torch.Tensor) -> None:
        with self.autocast:
            logits = self.model(input_ids=tokens[:, :-1], use_cache=False).logits
        loss = F.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


def _timed(step, batches, on_gpu: bool) -> float:
    if on_gpu:
        torch.cuda.synchronize()
    started = time.perf_counter()
    for tokens in batches:
        step(tokens)
    if on_gpu:
        torch.cuda.synchronize()
    return time.perf_counter() - started
