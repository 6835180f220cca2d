"""Model-parallel layouts side by side: ZeRO-3 alone against tensor 2 and tensor 4 with
ZeRO-1, and sequence 2 and 4 (Ulysses) with ZeRO-1, the same model, the same global batch,
the same ranks.

Each layout runs on 4 ranks (bench/layouts_ranks.py, the trainer's engine; --quick: the
layouts of 2 ranks on 2, with a smaller model, the suite's end-to-end test's budget); the figures
are ratios against ZeRO-3 in one run, so the machine's speed cancels. On a CPU the ranks
share the cores and gloo carries the all-reduces, so the ratio says what the layout costs
in communication and memory, not what it gains on NVLink: there a tensor group's
all-reduces inside each layer are what limits it to one node (docs/training.md, Model
parallelism).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import torch

from bench.hf import save_llama
from bench.launch import run_ranks
from bench.measure import metric

TITLE = "Model-parallel layouts (tensor and sequence parallelism vs ZeRO-3)"
RANKS = 4
SHAPE = {
    "hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 4,
    "num_attention_heads": 8, "num_key_value_heads": 4, "vocab_size": 4096,
}  # fmt: skip
# --quick (the suite's end-to-end test): the same kinds of layers, small enough that a
# layout's run is its start-up; the ratios then say nothing, the plumbing is what runs.
QUICK_SHAPE = {
    "hidden_size": 64, "intermediate_size": 172, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512,
}  # fmt: skip
# name: (tensor degree, sequence degree, ZeRO stage)
LAYOUTS = {
    "ZeRO-3": (1, 1, 3),
    "tensor 2 + ZeRO-1": (2, 1, 1),
    "tensor 4 + ZeRO-1": (4, 1, 1),
    "sequence 2 + ZeRO-1": (1, 2, 1),
    "sequence 4 + ZeRO-1": (1, 4, 1),
}


def run(quick: bool) -> dict:
    ranks = 2 if quick else RANKS
    if torch.cuda.is_available() and torch.cuda.device_count() < ranks:
        return {"skipped": f"needs {ranks} GPUs or a CPU run"}
    layouts = {name: d for name, d in LAYOUTS.items() if d[0] * d[1] <= ranks}
    shape, seq, global_batch = (QUICK_SHAPE, 32, 8) if quick else (SHAPE, 128, 8)
    steps = 3 if quick else 8
    work = Path(tempfile.mkdtemp(prefix="bench-layouts-"))
    save_llama(work / "model", shape, seq_len=seq, bf16=False)
    job = work / "job.toml"
    job.write_text(
        f'[model]\nhf = "{work / "model"}"\n'
        f'[data]\nkind = "synthetic"\nseq_len = {seq}\nvocab_size = {shape["vocab_size"]}\n'
        f"[train]\nglobal_batch_size = {global_batch}\n"
        '[scheduler]\nkind = "constant"\nwarmup_steps = 1\n'
    )
    measured = {}
    for name, (tensor, sequence, stage) in layouts.items():
        out = work / f"{name.replace(' ', '_')}.json"
        options = [
            *("--set", f"parallel.tensor={tensor}"),
            *("--set", f"parallel.sequence={sequence}"),
            *("--set", f"zero.stage={stage}"),
        ]
        run_ranks(
            "bench.layouts_ranks",
            ranks,
            [f"--config={job}", *options, f"--steps={steps}", f"--out={out}"],
            timeout=1200,
        )
        measured[name] = json.loads(out.read_text())
    base = measured["ZeRO-3"]
    metrics = []
    for name, result in measured.items():
        if name == "ZeRO-3":
            continue
        metrics.append(
            metric(
                f"{name}: tokens/s",
                result["tokens_per_s"],
                "tokens/s",
                baseline=base["tokens_per_s"],
                baseline_label="ZeRO-3 alone",
            )
        )
        metrics.append(
            metric(
                f"{name}: model states per rank",
                result["bytes_per_rank"] / 2**20,
                "MiB",
                baseline=base["bytes_per_rank"] / 2**20,
                baseline_label="ZeRO-3 alone",
                higher_is_better=False,
            )
        )
    return {
        "baseline": "ZeRO-3 alone on the same ranks, model and global batch",
        "setup": (
            f"Llama (hidden {shape['hidden_size']}, {shape['num_hidden_layers']} layers, "
            f"{shape['num_key_value_heads']} key/value heads) fp32, {ranks} "
            f"{'GPUs' if torch.cuda.is_available() else 'CPU ranks (gloo)'}, global batch "
            f"{global_batch} x {seq} tokens, {steps} timed steps after 2 warm-up steps"
        ),
        "metrics": metrics,
        "measured": measured,
        "notes": [
            "model states per rank: parameters and optimizer state (fp32 master, Adam's "
            "moments) the rank holds after its steps, the largest rank's; DeepSpeed's "
            "fixed-size buffers and activations are left out",
            "on CPU ranks sharing cores, gloo carries the all-reduces a tensor group makes "
            "inside every layer, and the all-to-alls a sequence group makes inside every "
            "attention: the tokens/s ratio is a lower bound of what NVLink gives",
            "sequence parallelism keeps whole weights on every rank (its model states are "
            "ZeRO-1's over all ranks); what it splits is the activations, left out here",
        ],
    }
