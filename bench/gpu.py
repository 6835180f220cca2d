"""GPU benchmark for one lent GPU (an H200 here), in one call of under 8 minutes.

    python bench/gpu.py [--out DIR]        # on the GPU machine, from the repository root
    python bench/gpu.py --dry-run          # anywhere: CPU, tiny sizes, the same code path

For the ~350M and ~1.3B presets in bf16 with ZeRO-2 and ZeRO-3 it runs, each as its own
job on the one GPU: the trainer (`python -m training`), the hand-written DeepSpeed loop and
(once per preset) plain PyTorch with fused AdamW and autocast (bench/loops.py), and
reports tokens/s, TFLOPS, MFU against the GPU's dense bf16 peak (training/gpu_peaks.toml)
and peak GPU memory. Targets: MFU >= 50%, the trainer >= 0.95x plain PyTorch.

The GPU machine has PyTorch and nvcc but neither DeepSpeed nor a network. Carry the pins
of images/locks/cu128.txt that it lacks in .whl/ beside the repository, fetched here:

    python bench/gpu.py --fetch-wheels --python 3.12    # the GPU machine's Python; ~38 MiB
    # = pip download deepspeed==<pin> --no-deps -d .whl (DeepSpeed is a source
    #   distribution), and the binary wheels of its and the trainer's other dependencies

On the GPU machine the script installs what is missing from there, before anything else:

    pip install --no-index --find-links .whl --no-deps --no-build-isolation <missing pins>

(DeepSpeed builds from its source there with the machine's torch; its CUDA ops, FusedAdam
first, are compiled just in time by nvcc on the first step.) A deadline stops starting
new jobs so that the call ends in time; what ran is written either way.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.launch import QUIET, REPO_ROOT, run_ranks, training_command, training_env
from bench.measure import median, metric

TITLE = "GPU (one H200)"
RESULTS = REPO_ROOT / "bench" / "results" / "gpu" / "gpu.json"

WHEELS = REPO_ROOT / ".whl"
LOCK = REPO_ROOT / "images" / "locks" / "cu128.txt"
# What the trainer and DeepSpeed import beyond torch: distribution -> module.
CARRIED = {
    "deepspeed": "deepspeed", "hjson": "hjson", "ninja": "ninja", "py-cpuinfo": "cpuinfo",
    "msgpack": "msgpack", "einops": "einops", "pydantic": "pydantic",
    "pydantic-core": "pydantic_core", "annotated-types": "annotated_types",
    "typing-inspection": "typing_inspection", "typing-extensions": "typing_extensions",
    "packaging": "packaging", "psutil": "psutil", "tqdm": "tqdm", "numpy": "numpy",
    "nvidia-ml-py": "pynvml", "boto3": "boto3", "botocore": "botocore",
    "jmespath": "jmespath", "s3transfer": "s3transfer", "urllib3": "urllib3",
    "python-dateutil": "dateutil", "six": "six",
}  # fmt: skip
DEADLINE_S = 7 * 60  # no job starts after this; the call then ends within 8 minutes
WINDOW, ROUNDS = 10, 3  # steps per timed window; timed windows after one warm-up
JOB = (
    "precision.bf16=true", "data.seq_len=1024", "data.vocab_size=50304",
    "scheduler.kind=constant", "scheduler.warmup_steps=1", "checkpoint.every_steps=1000000",
    *QUIET,
)  # fmt: skip
PLAN = [
    # (preset, micro batch, ZeRO stage, loops besides the trainer)
    ("gpt-350m", 16, 2, ("deepspeed", "pytorch")),
    ("gpt-350m", 16, 3, ("deepspeed",)),
    ("gpt-1.3b", 8, 2, ("deepspeed", "pytorch")),
    ("gpt-1.3b", 8, 3, ("deepspeed",)),
]
DRY_RUN_JOB = ("precision.bf16=true", "data.seq_len=32", "data.vocab_size=256",
               "scheduler.kind=constant", "scheduler.warmup_steps=1",
               "checkpoint.every_steps=1000000", *QUIET)  # fmt: skip
DRY_RUN_PLAN = [("tiny", 2, 2, ("deepspeed", "pytorch"))]
TARGET_MFU, TARGET_VS_PYTORCH = 0.50, 0.95


def run(quick: bool) -> dict:
    """For `python -m bench all`: the figures of the last GPU run, if any; the plan checked."""
    import torch

    if torch.cuda.is_available() and not quick:
        main(["--out", str(RESULTS.parent)])
    check_plan(PLAN, JOB)  # a plan that no longer validates fails here, GPU or not
    if not RESULTS.is_file() or json.loads(RESULTS.read_text())["dry_run"]:
        return {"skipped": "no GPU run yet: bench/gpu.py is ready for one (its plan validates)"}
    report = json.loads(RESULTS.read_text())
    metrics = []
    for c in report["configurations"]:
        if "skipped" in c:
            continue
        name = f"{c['preset']} ZeRO-{c['zero_stage']}"
        metrics.append(metric(f"{name}: trainer (ratio = MFU)", c["trainer"]["tflops"], "TFLOPS",
                              baseline=c["peak_tflops"], baseline_label="dense bf16 peak",
                              target=">= 0.50"))  # fmt: skip
        metrics.append(metric(f"{name}: trainer", c["trainer"]["tokens_per_s"], "tokens/s",
                              baseline=c["deepspeed"]["tokens_per_s"],
                              baseline_label="raw DeepSpeed loop"))  # fmt: skip
        if "pytorch" in c:
            metrics.append(metric(f"{name}: trainer", c["trainer"]["tokens_per_s"], "tokens/s",
                                  baseline=c["pytorch"]["tokens_per_s"],
                                  baseline_label="plain PyTorch", target=">= 0.95"))  # fmt: skip
    gpu = next((c["gpu"] for c in report["configurations"] if c.get("gpu")), "?")
    return {
        "baseline": "the raw DeepSpeed loop and plain PyTorch on the same GPU; the GPU's peak",
        "setup": f"{gpu}, bf16, seq 1024, from {RESULTS.relative_to(REPO_ROOT)}",
        "metrics": metrics,
        "report": report,
    }


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.fetch_wheels:
        return fetch_wheels(args.python or [f"{sys.version_info[0]}.{sys.version_info[1]}"])
    installed = ensure_dependencies(dry_run=args.dry_run)
    import torch

    if not args.dry_run and not torch.cuda.is_available():
        print("error: no CUDA GPU here; run with --dry-run to check the plan on CPU")
        return 2
    plan, job = (DRY_RUN_PLAN, DRY_RUN_JOB) if args.dry_run else (PLAN, JOB)
    checked = check_plan(plan, job)
    for line in checked:
        print(f"plan: {line['preset']} ZeRO-{line['zero_stage']} micro {line['micro']}: "
              f"{line['params'] / 1e6:.0f}M params, "
              f"{line['flops_per_token'] / 1e9:.2f} GFLOP/token, "
              f"loops trainer + {', '.join(line['loops'])}")  # fmt: skip
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    results = []
    for (preset, micro, stage, loops), info in zip(plan, checked, strict=True):
        if time.monotonic() - started > DEADLINE_S:
            results.append({**info, "skipped": "deadline reached before this configuration"})
            continue
        results.append({**info, **_measure(preset, micro, stage, loops, job, info)})
        _write(out, results, installed, args.dry_run)
    report = _write(out, results, installed, args.dry_run)
    for r in report["configurations"]:
        print(json.dumps(r))
    return 0


def ensure_dependencies(*, dry_run: bool) -> list[str]:
    """Install from .whl/ the carried distributions whose module is missing; their pins."""
    pins = lock_pins()
    missing = [d for d, module in CARRIED.items() if importlib.util.find_spec(module) is None]
    wanted = [f"{d}=={pins[d]}" for d in missing]
    if not missing:
        return []
    if dry_run or not WHEELS.is_dir():
        print(f"missing: {' '.join(wanted)}"
              + ("" if WHEELS.is_dir() else f" and no {WHEELS}: see --fetch-wheels"))  # fmt: skip
        if not dry_run:
            raise SystemExit(2)
        return []
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-index", "--find-links", str(WHEELS),
         "--no-deps", "--no-build-isolation", *wanted],
        check=True,
    )  # fmt: skip
    return wanted


def fetch_wheels(pythons: list[str]) -> int:
    """Fill .whl/ (run where there is a network): the carried pins for each Python."""
    pins = lock_pins()
    WHEELS.mkdir(exist_ok=True)
    pip = [sys.executable, "-m", "pip", "download", "--no-deps", "-d", str(WHEELS)]
    subprocess.run([*pip, f"deepspeed=={pins['deepspeed']}"], check=True)
    for python in pythons:
        for distribution in CARRIED:
            if distribution == "deepspeed":
                continue
            subprocess.run(
                [*pip, "--only-binary=:all:", "--implementation", "cp", "--python-version",
                 python, "--platform", "manylinux_2_28_x86_64", "--platform",
                 "manylinux_2_17_x86_64", "--platform", "manylinux2014_x86_64",
                 f"{distribution}=={pins[distribution]}"],
                check=True,
            )  # fmt: skip
    print(f"{WHEELS}: {sum(p.stat().st_size for p in WHEELS.iterdir()) / 2**20:.0f} MiB")
    return 0


def lock_pins() -> dict[str, str]:
    pins = dict(re.findall(r"^([A-Za-z0-9_.\-]+)==([^\s\\;]+)", LOCK.read_text(), re.MULTILINE))
    return {name.lower(): version for name, version in pins.items()}


def check_plan(plan, job) -> list[dict]:
    """Every configuration validates as the trainer would check it; sizes and FLOPs."""
    import torch

    from training.components import build_model
    from training.ds_config import build_ds_config
    from training.spec.config import load_config, validate
    from training.trainer import flops_per_token

    checked = []
    for preset, micro, stage, loops in plan:
        overrides = _overrides(job, preset, micro, stage)
        config = load_config(None, overrides, env={})
        batch = validate(config, world_size=1)
        build_ds_config(config, batch, on_gpu=True)
        with torch.device("meta"):
            model = build_model(config)
        checked.append({
            "preset": preset, "micro": micro, "zero_stage": stage, "loops": list(loops),
            "seq_len": config.data.seq_len,
            "params": sum(p.numel() for p in model.parameters()),  # a tied weight counts once
            "flops_per_token": flops_per_token(model, config.data.seq_len),
            "tokens_per_step": batch.global_batch_size * config.data.seq_len,
        })  # fmt: skip
    return checked


def _overrides(job, preset: str, micro: int, stage: int) -> list[str]:
    return [*job, f"model.preset={preset}", f"train.micro_batch_size={micro}",
            f"zero.stage={stage}", f"logging.every_steps={WINDOW}"]  # fmt: skip


def _measure(preset, micro, stage, loops, job, info: dict) -> dict:
    import torch

    from training.metrics import peak_tflops

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    peak = peak_tflops(gpu, bf16=True)
    overrides = _overrides(job, preset, micro, stage)
    rates, memory = {}, {}
    # The jobs' folders (a run, its logs, the loops' reports) go once their figures are read.
    with tempfile.TemporaryDirectory(prefix=f"bench-gpu-{preset}-zero{stage}-") as scratch:
        work = Path(scratch)
        rates["trainer"], memory["trainer"] = _trainer(work / "trainer", overrides)
        for loop in loops:
            report_file = work / f"{loop}.json"
            options = [a for o in overrides for a in ("--set", o)]
            run_ranks("bench.loops", 1, [*options, f"--window={WINDOW}", f"--rounds={ROUNDS}",
                                         "--calls=0", f"--loops={loop}", f"--out={report_file}"],
                      timeout=300)  # fmt: skip
            report = json.loads(report_file.read_text())
            rates[loop] = report["tokens_per_window"] / median(report["seconds_per_window"][loop])
            memory[loop] = report["gpu_peak_allocated_gib"]
    figures = {"gpu": gpu, "peak_tflops": peak}
    for name, rate in rates.items():
        tflops = info["flops_per_token"] * rate / 1e12
        figures[name] = {
            "tokens_per_s": rate,
            "tflops": tflops,
            "mfu": tflops / peak if peak else None,
            "gpu_memory_gib": memory[name],
        }
    figures["trainer_over_deepspeed"] = rates["trainer"] / rates["deepspeed"]
    if "pytorch" in rates:
        figures["trainer_over_pytorch"] = rates["trainer"] / rates["pytorch"]
    return figures


def _trainer(work: Path, overrides) -> tuple[float, float | None]:
    """Trainer tokens/s (median window after the first) and its peak GPU memory (NVML).

    Stopped with SIGKILL once its windows are in: the end-of-run checkpoint of a 1.3B model
    would spend the GPU's time on disk writes."""
    work.mkdir(parents=True, exist_ok=True)
    windows = ROUNDS + 1
    command = training_command([*overrides, f"train.steps={WINDOW * (windows + 1)}"])
    log = open(work / "log.txt", "w")  # noqa: SIM115 (closed below)
    # Its temporary files in `work` too: killed, the launcher cannot remove its own.
    env = training_env(work, 1, TMPDIR=str(work))
    job = subprocess.Popen(command, cwd=work, env=env, stdout=log,
                           stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    metrics = work / "out" / "metrics.jsonl"
    try:
        while True:
            records = _records(metrics)
            if len(records) >= windows or job.poll() is not None:
                break
            time.sleep(0.5)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
        job.wait()
        log.close()
    if len(records) < windows:
        tail = (work / "log.txt").read_text()[-3000:]
        raise RuntimeError(f"trainer: {len(records)} windows:\n{tail}")
    tokens_per_step = records[-1]["tokens_per_s"] * records[-1]["step_time_s"]
    used = [r["gpu_mem_used_gib"] for r in records if "gpu_mem_used_gib" in r]
    return tokens_per_step / median([r["step_time_s"] for r in records[1:]]), max(used or [None])


def _records(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            break
    return records


def _write(out: Path, results: list[dict], installed: list[str], dry_run: bool) -> dict:
    report = {
        "dry_run": dry_run,
        "installed_from_wheels": installed,
        "targets": {"mfu": TARGET_MFU, "trainer_over_pytorch": TARGET_VS_PYTORCH},
        "configurations": results,
    }
    (out / "gpu.json").write_text(json.dumps(report, indent=1) + "\n")
    return report


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dry-run", action="store_true", help="CPU, tiny sizes, the same code path")
    p.add_argument("--out", default=str(REPO_ROOT / "bench" / "results" / "gpu"))
    p.add_argument("--fetch-wheels", action="store_true", help="fill .whl/ (needs a network)")
    p.add_argument("--python", action="append", help="with --fetch-wheels: X.Y (repeatable)")
    return p


if __name__ == "__main__":
    sys.exit(main())
