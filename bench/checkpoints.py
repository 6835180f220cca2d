"""Checkpoints: the trainer's Checkpointer vs plain torch.save of the same bytes, same disk.

One process (a world of one), a ZeRO-2 engine built as the trainer builds it, one step
trained so that the optimizer holds its state. Per round, interleaved: a blocking
Checkpointer.save (DeepSpeed's files, fsync, commit marker, pruning), an asynchronous one
(the part training waits for: the copy to host memory; then the background part: write,
checksums, fsync, commit, pruning, timed alone), torch.save of the very objects those
files hold (read back once), each file fsynced as the Checkpointer does, and DeepSpeed's
save_checkpoint alone. Then load and verify (Checkpointer.resume: examine + DeepSpeed's
load) vs torch.load of the same files, and the stall a training step sees when it saves:
the step that saves, blocking and asynchronous (its rate with the save after it over its
rate alone, both timed in the same round), and a window of WINDOW_STEPS steps that
starts with an asynchronous save and ends once it is committed (the background write
shares this machine's cores with training).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import psutil
import torch

from bench.measure import interleaved, median, metric, timed
from bench.single import train_step, trainer_engine
from training.checkpoint.checkpointer import Checkpointer
from training.checkpoint.layout import examine, fsync_path, tag_for

TITLE = "Checkpoints"
# (label, config overrides): growth with model size, fp32 as on CPU.
SIZES = {
    "tiny": ("model.preset=tiny", "data.vocab_size=128", "data.seq_len=64"),
    "small (~5M)": (
        "model.preset=tiny", "model.n_layer=4", "model.n_embd=256", "model.n_head=4",
        "data.vocab_size=8192", "data.seq_len=64",
    ),
    "gpt-124m": ("model.preset=gpt-124m", "data.vocab_size=50304", "data.seq_len=64"),
    "gpt-350m": ("model.preset=gpt-350m", "data.vocab_size=50304", "data.seq_len=64"),
}  # fmt: skip
QUICK_SIZES = ("tiny",)
# gpt-350m needs ~12 GiB for its engine and copies: more than a shared 24 GiB machine spares.
FULL_SIZES = ("tiny", "small (~5M)", "gpt-124m")
WINDOW_STEPS = 4
# A step's time varies by a fifth from one to the next on a shared CPU, more than a save
# blocks it: the step figures take this many more rounds than the saves.
STEP_EXTRA_ROUNDS = 2
COMMON = ("train.micro_batch_size=2", "zero.stage=2", "scheduler.kind=constant")
# fp32 params + grads + Adam's two moments + ZeRO's fp32 master copy, plus the objects the
# baseline reads back: the memory a size needs here, about.
BYTES_PER_PARAM_NEEDED = 4 * (1 + 1 + 2 + 1) + 16


def run(quick: bool) -> dict:
    sizes = QUICK_SIZES if quick else FULL_SIZES
    rounds = 2 if quick else 3
    root = Path(tempfile.mkdtemp(prefix="bench-checkpoints-"))
    per_size, skipped, metrics = {}, {}, []
    for label in sizes:
        params = _param_count(SIZES[label])
        needed = params * BYTES_PER_PARAM_NEEDED
        available = psutil.virtual_memory().available
        if needed > 0.6 * available:
            skipped[label] = (
                f"needs ~{needed / 2**30:.1f} GiB, {available / 2**30:.1f} GiB available"
            )
            continue
        per_size[label] = _measure(SIZES[label], root / label.split()[0], rounds)
        per_size[label]["params"] = params
    shutil.rmtree(root, ignore_errors=True)
    for label, m in per_size.items():
        gb = m["bytes"] / 1e9
        torch_rate = m["bytes"] / m["torch_save_s"] / 1e6
        metrics += [
            metric(f"{label}: background save ({gb:.2g} GB)",
                   m["bytes"] / m["background_s"] / 1e6, "MB/s", baseline=torch_rate,
                   baseline_label="torch.save + fsync", target=">= 0.7"),
            metric(f"{label}: blocking save ({gb:.2g} GB)", m["bytes"] / m["save_s"] / 1e6,
                   "MB/s", baseline=torch_rate, baseline_label="torch.save + fsync"),
            metric(f"{label}: training blocked per checkpoint, async", m["blocked_s"], "s",
                   baseline=m["save_s"], baseline_label="blocking save",
                   higher_is_better=False),
            metric(f"{label}: of which engine.save_checkpoint",
                   m["bytes"] / m["deepspeed_save_s"] / 1e6,
                   "MB/s", baseline=m["bytes"] / m["torch_save_s"] / 1e6,
                   baseline_label="torch.save + fsync"),
            metric(f"{label}: load + verify", m["bytes"] / m["load_s"] / 1e6, "MB/s",
                   baseline=m["bytes"] / m["torch_load_s"] / 1e6, baseline_label="torch.load"),
            metric(f"{label}: step with a checkpoint, async",
                   m["step_rate_with_async_save"], "x step rate",
                   ratio=m["step_rate_with_async_save"],
                   baseline=1.0, baseline_label="step without", target=">= 0.9"),
            metric(f"{label}: step with a checkpoint, blocking",
                   m["step_rate_with_save"], "x step rate", ratio=m["step_rate_with_save"],
                   baseline=1.0, baseline_label="step without"),
            metric(f"{label}: {WINDOW_STEPS} steps with an async checkpoint written meanwhile",
                   m["window_s"] / m["window_with_save_s"], "x step rate",
                   ratio=m["window_s"] / m["window_with_save_s"],
                   baseline=1.0, baseline_label=f"{WINDOW_STEPS} steps without"),
        ]  # fmt: skip
    return {
        "baseline": "torch.save of the same objects to the same disk, fsynced (save); "
        "torch.load of the same files (load)",
        "setup": f"1 process, ZeRO-2 fp32, {rounds} interleaved rounds "
        f"({rounds + STEP_EXTRA_ROUNDS} for the steps), "
        f"disk of {tempfile.gettempdir()}",
        "metrics": metrics,
        "sizes": per_size,
        "skipped_sizes": skipped,
        "notes": [
            f"{label}: {m['params'] / 1e6:.1f}M params, {m['bytes'] / 1e6:.1f} MB in "
            f"{m['files']} files; blocking save {m['save_s']:.2f} s (DeepSpeed's own save, "
            f"no fsync, {m['deepspeed_save_s']:.2f} s; torch.save + fsync "
            f"{m['torch_save_s']:.2f} s); async: training blocked {m['blocked_s']:.2f} s, "
            f"then {m['background_s']:.2f} s in the background; "
            f"verify {1000 * m['verify_s']:.1f} ms, load + verify {m['load_s']:.2f} s, "
            f"step {m['step_s']:.2f} s, with a blocking save {m['step_with_save_s']:.2f} s, "
            f"with an async one {m['step_with_async_save_s']:.2f} s"
            for label, m in per_size.items()
        ]
        + [f"{label} not run: {why}" for label, why in skipped.items()],
    }


def _param_count(overrides) -> int:
    from training.components import build_model
    from training.spec.config import load_config

    with torch.device("meta"):
        model = build_model(load_config(None, [*COMMON, *overrides], env={}))
    return sum(p.numel() for p in model.parameters())


def _measure(overrides, folder: Path, rounds: int) -> dict:
    engine, config = trainer_engine([*COMMON, *overrides])
    train_step(engine, config)
    checkpointer = Checkpointer(folder / "ckpt", keep_last=1)
    in_background = Checkpointer(folder / "async", keep_last=1, asynchronous=True)
    async_parts: dict[str, list[float]] = {"blocked": [], "background": []}

    def async_save() -> float:
        blocked = timed(lambda: in_background.save(engine, next(step), {}))
        async_parts["blocked"].append(blocked)
        async_parts["background"].append(timed(in_background.wait))
        return blocked

    step = iter(range(1, 10**6))
    first = checkpointer.save(engine, next(step), {"step": 0})
    # The first asynchronous save allocates its staging buffers; a run's later ones reuse
    # them (training/checkpoint/writer.py): the rounds measure those.
    in_background.save(engine, next(step), {})
    in_background.wait()
    files = sorted(p for p in first.rglob("*.pt"))
    objects = [torch.load(p, map_location="cpu", weights_only=False) for p in files]
    size = sum(p.stat().st_size for p in first.rglob("*") if p.is_file())
    plain = folder / "plain"
    plain.mkdir(parents=True, exist_ok=True)

    def torch_save() -> float:
        def save():
            for index, obj in enumerate(objects):
                path = plain / f"{index}.pt"
                torch.save(obj, path)
                fsync_path(path)
            fsync_path(plain, directory=True)

        return timed(save)

    saves = interleaved(
        {
            "checkpointer": lambda: timed(lambda: checkpointer.save(engine, next(step), {})),
            "async": async_save,
            "torch.save": torch_save,
            "deepspeed": lambda: timed(
                lambda: engine.save_checkpoint(
                    str(folder / "ds"), tag=tag_for(next(step)), save_latest=False
                )
            ),
        },
        rounds,
    )
    objects.clear()  # the memory goes back before the loads
    newest = (
        folder / "ckpt" / tag_for(max(int(p.name[5:]) for p in (folder / "ckpt").glob("step_*")))
    )
    loads = interleaved(
        {
            "checkpointer": lambda: timed(lambda: checkpointer.resume(engine)),
            "torch.load": lambda: timed(
                lambda: [torch.load(p, map_location="cpu", weights_only=False)
                         for p in sorted(newest.rglob("*.pt"))]
            ),
            "verify": lambda: timed(lambda: examine(newest)),
        },
        rounds,
    )  # fmt: skip

    # Per round, a step and the save after it, each timed: the step's rate with the save over
    # its rate alone, in the same round (a step's time varies by a fifth from one round to the
    # next on a shared CPU, more than an asynchronous save blocks it).
    step_rates: dict[str, list[float]] = {"blocking": [], "async": []}

    def step_then(save, kind: str) -> float:
        step_s = timed(lambda: train_step(engine, config))
        save_s = timed(lambda: save(engine, next(step), {}))
        in_background.wait()  # the next figure starts with nothing in flight
        step_rates[kind].append(step_s / (step_s + save_s))
        return step_s + save_s

    def window(save: bool) -> float:
        def steps():
            train_step(engine, config)
            if save:
                in_background.save(engine, next(step), {})
            for _ in range(WINDOW_STEPS - 1):
                train_step(engine, config)
            in_background.wait()

        return timed(steps)

    steps = interleaved(
        {
            "step": lambda: timed(lambda: train_step(engine, config)),
            "step+save": lambda: step_then(checkpointer.save, "blocking"),
            "step+async save": lambda: step_then(in_background.save, "async"),
            "window": lambda: window(save=False),
            "window+async save": lambda: window(save=True),
        },
        rounds + STEP_EXTRA_ROUNDS,
    )
    return {
        "bytes": size,
        "files": len(files),
        "save_s": median(saves["checkpointer"]),
        "blocked_s": median(async_parts["blocked"]),
        "background_s": median(async_parts["background"]),
        "torch_save_s": median(saves["torch.save"]),
        "deepspeed_save_s": median(saves["deepspeed"]),
        "load_s": median(loads["checkpointer"]),
        "torch_load_s": median(loads["torch.load"]),
        "verify_s": median(loads["verify"]),
        "step_s": median(steps["step"]),
        "step_with_save_s": median(steps["step+save"]),
        "step_with_async_save_s": median(steps["step+async save"]),
        "step_rate_with_save": median(step_rates["blocking"]),
        "step_rate_with_async_save": median(step_rates["async"]),
        "window_s": median(steps["window"]),
        "window_with_save_s": median(steps["window+async save"]),
        "rounds": {"save": saves, "load": loads, "step": steps},
    }
