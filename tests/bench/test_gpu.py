"""bench/gpu.py: its plan validates, and --dry-run runs the whole path on CPU."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bench import gpu
from tests.training.multirank import REPO_ROOT, launch_env
from training.spec.presets import PRESETS


def test_the_gpu_plan_validates_with_the_presets_sizes():
    checked = gpu.check_plan(gpu.PLAN, gpu.JOB)
    assert [(c["preset"], c["zero_stage"]) for c in checked] == [
        ("gpt-350m", 2), ("gpt-350m", 3), ("gpt-1.3b", 2), ("gpt-1.3b", 3),
    ]  # fmt: skip
    for c in checked:
        shape = PRESETS[c["preset"]]
        d, layers = shape["n_embd"], shape["n_layer"]
        # 12 d^2 per block (attention 4 d^2, MLP 8 d^2), tied embeddings, 1024 positions.
        expected = layers * 12 * d * d + 50304 * d + 1024 * d
        assert c["params"] == pytest.approx(expected, rel=0.01)
        assert c["tokens_per_step"] == c["micro"] * 1024


def test_every_carried_distribution_is_pinned_in_the_gpu_lock():
    pins = gpu.lock_pins()
    assert set(gpu.CARRIED) <= set(pins)


@pytest.mark.multiprocess
@pytest.mark.slow(
    reason="three short CPU runs: the trainer, raw DeepSpeed and plain PyTorch", seconds=90
)
def test_dry_run_measures_trainer_raw_deepspeed_and_pytorch_on_cpu(tmp_path):
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    result = subprocess.run(
        [sys.executable, "bench/gpu.py", "--dry-run", "--out", str(tmp_path)],
        cwd=REPO_ROOT,
        env=launch_env(OMP_NUM_THREADS="1", TMPDIR=str(temporary)),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "plan: tiny ZeRO-2" in result.stdout
    # The jobs' folders are gone once measured: no run, log or launcher folder is left,
    # only torch's compile cache (TORCHINDUCTOR_CACHE_DIR's default), kept for the next run.
    left = [path.name for path in temporary.iterdir()]
    assert all(name.startswith("torchinductor_") for name in left), left
    report = json.loads((tmp_path / "gpu.json").read_text())
    assert report["dry_run"] is True
    (config,) = report["configurations"]
    for loop in ("trainer", "deepspeed", "pytorch"):
        figures = config[loop]
        assert figures["tokens_per_s"] > 0
        assert figures["tflops"] == pytest.approx(
            config["flops_per_token"] * figures["tokens_per_s"] / 1e12
        )
        assert figures["mfu"] is None  # no GPU peak on CPU
    assert config["trainer_over_pytorch"] == pytest.approx(
        config["trainer"]["tokens_per_s"] / config["pytorch"]["tokens_per_s"]
    )
