"""The DeepSpeed JSON built from the config, and `--print-ds-config`."""

from __future__ import annotations

import json

from tests.support.preloaded import run_module
from tests.training.multirank import launch_env
from training.ds_config import build_ds_config
from training.spec.config import load_config, validate


def _ds(*overrides: str, world_size: int = 2, on_gpu: bool = False) -> dict:
    config = load_config(None, list(overrides), env={})
    return build_ds_config(config, validate(config, world_size), on_gpu=on_gpu)


def test_batch_sizes_clipping_and_optimizer():
    ds = _ds(
        "train.global_batch_size=64",
        "train.micro_batch_size=4",
        "train.gradient_clipping=0.5",
        "optimizer.lr=1e-4",
        world_size=4,
    )
    assert (
        ds["train_batch_size"],
        ds["train_micro_batch_size_per_gpu"],
        ds["gradient_accumulation_steps"],
    ) == (64, 4, 4)
    assert ds["gradient_clipping"] == 0.5
    assert ds["optimizer"]["type"] == "AdamW"
    assert ds["optimizer"]["params"]["lr"] == 1e-4


def test_torch_adam_on_cpu_only():
    assert _ds(on_gpu=False)["optimizer"]["params"]["torch_adam"] is True
    assert "torch_adam" not in _ds(on_gpu=True)["optimizer"]["params"]


def test_zero_stage_and_cpu_offload():
    ds = _ds("zero.stage=3", "zero.offload_optimizer=true", "zero.offload_param=true", on_gpu=True)
    zero = ds["zero_optimization"]
    assert zero["stage"] == 3
    assert zero["offload_optimizer"] == {"device": "cpu", "pin_memory": True}
    assert zero["offload_param"] == {"device": "cpu", "pin_memory": True}
    assert _ds("zero.stage=1")["zero_optimization"] == {"stage": 1}


def test_precision_blocks():
    assert _ds("precision.bf16=true")["bf16"] == {"enabled": True}
    assert "fp16" not in _ds("precision.bf16=true")
    fp16 = _ds("precision.fp16=true", "precision.initial_scale_power=12")["fp16"]
    assert fp16["enabled"] and fp16["loss_scale"] == 0  # dynamic loss scaling
    assert fp16["initial_scale_power"] == 12
    plain = _ds()
    assert "bf16" not in plain and "fp16" not in plain


def test_schedulers():
    cosine = _ds(
        "scheduler.kind=cosine", "scheduler.warmup_steps=10", "train.steps=100", "optimizer.lr=1"
    )["scheduler"]
    assert cosine["type"] == "WarmupCosineLR"
    assert cosine["params"]["total_num_steps"] == 100
    assert cosine["params"]["warmup_num_steps"] == 10
    constant = _ds("scheduler.kind=constant", "optimizer.lr=0.01")["scheduler"]
    assert constant["type"] == "WarmupLR"
    assert constant["params"]["warmup_max_lr"] == 0.01


def test_print_ds_config_prints_json_and_exits(tmp_path):
    result = run_module(
        "training",
        ["--print-ds-config", "--set", "zero.stage=3"],
        env=launch_env(TRAIN_NPROC_PER_NODE="3", TRAIN_NNODES="2", TRAIN_NODE_RANK="0"),
    )
    assert result.returncode == 0, result.stderr
    ds = json.loads(result.stdout)
    assert ds["zero_optimization"]["stage"] == 3
    # The demo's micro batch of 8 on 2 nodes x 3 workers.
    assert ds["train_batch_size"] == 8 * 6
