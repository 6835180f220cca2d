"""MFU arithmetic, the GPU peak table, and the metrics file."""

from __future__ import annotations

import json
import subprocess

import pytest
import torch

from tests.support.tools import require_tool
from training.metrics import GpuMonitor, MetricsSink, load_peaks, mfu, peak_tflops
from training.model import build_gpt


def test_mfu_of_gpt_124m_matches_a_hand_computation():
    # GPT-2 124M with vocab 50304, T = 1024. Per block 12*d^2 + 13*d parameters (d = 768);
    # N leaves out the position table but keeps the token table (tied to lm_head).
    d = 768
    n = 50304 * d + 12 * (12 * d * d + 13 * d) + 2 * d
    assert n == 123_689_472
    with torch.device("meta"):  # shapes only
        model = build_gpt("gpt-124m", vocab_size=50304, seq_len=1024)
    assert model.num_params() == n
    assert model.num_params(non_embedding=False) == n + 1024 * d
    # 12 * L * H * Q * T = 12 * 12 * 12 * 64 * 1024 = 113,246,208 attention FLOPs per token.
    assert model.flops_per_token(1024) == 6 * n + 113_246_208
    # 150,000 tokens/s per A100 (bf16 peak 312 TFLOPS):
    # (742,136,832 + 113,246,208) * 150,000 / 312e12 = 0.41124...
    achieved = mfu(
        model.flops_per_token(1024), 150_000, peak_tflops("NVIDIA A100-SXM4-80GB", bf16=True)
    )
    assert achieved == pytest.approx(855_383_040 * 150_000 / 312e12)
    assert achieved == pytest.approx(0.41124, abs=1e-5)


@pytest.mark.parametrize(
    ("nvml_name", "bf16", "peak"),
    [
        ("NVIDIA A100-SXM4-80GB", True, 312),
        ("NVIDIA A100-PCIE-40GB", False, 312),
        ("NVIDIA H100 80GB HBM3", True, 989),
        ("NVIDIA H100 PCIe", True, 756),
        ("NVIDIA H200", True, 989),
        ("Tesla V100-SXM2-16GB", True, 125),  # no bf16 on Volta: the fp16 peak
        ("NVIDIA L40S", True, 362),
        ("NVIDIA L4", True, 121),
        ("NVIDIA A10G", True, 70),
        ("Tesla T4", False, 65),
        ("Some Future GPU", True, None),
        (None, True, None),
    ],
)
def test_peak_lookup_by_nvml_name(nvml_name, bf16, peak):
    assert peak_tflops(nvml_name, bf16=bf16) == peak


def test_every_peak_has_a_source():
    peaks = load_peaks()
    assert len(peaks) >= 8
    for peak in peaks:
        assert peak.source and (peak.bf16 or peak.fp16)


def test_mfu_is_none_without_a_known_peak():
    assert mfu(1e9, 1000, None) is None


def test_sink_appends_jsonl_and_tensorboard(tmp_path):
    sink = MetricsSink(tmp_path, total_steps=3, start_step=0, tensorboard=True, progress_bar=True)
    for step in (1, 2):
        sink.write({"step": step, "loss": 3.0 - step, "mfu": None})
        sink.advance()
    sink.close()
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["loss"] for line in lines] == [2.0, 1.0]
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))


def test_plain_tensorboard_reads_the_run_folder(tmp_path):
    """`tensorboard --logdir RUN` as a user types it, with the venv's own entry point: it once
    crashed on import (pkg_resources gone from setuptools 81+)."""
    sink = MetricsSink(tmp_path, total_steps=2, start_step=0, tensorboard=True, progress_bar=False)
    for step in (1, 2):
        sink.write({"step": step, "loss": 3.0 - step, "mfu": None})
        sink.advance()
    sink.close()
    tensorboard = require_tool("tensorboard", "tensorboard", pip=True)
    result = subprocess.run(
        [tensorboard, "--inspect", "--logdir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "train/loss" in result.stdout, result.stdout


def test_gpu_monitor_reads_nothing_without_a_gpu():
    monitor = GpuMonitor(local_rank=0)
    if monitor.name is not None:
        pytest.skip("a GPU is present")
    assert monitor.read() == {}


def test_run_cost_counts_gpu_hours_and_prices_them_when_the_stack_gives_a_price():
    from training.metrics import run_cost

    assert run_cost(1800, 8, None) == "4.00 GPU-hours"
    assert run_cost(1800, 8, 32.7726) == "4.00 GPU-hours, $16.39 at $32.77/h"
    assert run_cost(36, 1, None) == "0.01 GPU-hours"  # plain decimals, never 1e-02


@pytest.mark.parametrize("text", ["cheap", "-1", "nan", "inf"])
def test_a_bad_price_is_a_config_error(text):
    from training.environment import TrainerEnv
    from training.spec.config import ConfigError

    with pytest.raises(ConfigError, match=f"TRAIN_USD_PER_HOUR='{text}' is not a price"):
        TrainerEnv.from_environ({"TRAIN_USD_PER_HOUR": text})


def test_no_price_is_none():
    from training.environment import TrainerEnv

    def price(environ: dict[str, str]) -> float | None:
        return TrainerEnv.from_environ(environ).usd_per_hour

    assert price({}) is None and price({"TRAIN_USD_PER_HOUR": " "}) is None
    assert price({"TRAIN_USD_PER_HOUR": "3.06"}) == 3.06
