"""The one place the DeepSpeed JSON is built from the validated config."""

from __future__ import annotations

from typing import Any

from training.spec.config import BatchSizes, Config
from training.spec.parallel import tensor_degree


def build_ds_config(config: Config, batch: BatchSizes, *, on_gpu: bool) -> dict[str, Any]:
    zero, precision, opt = config.zero, config.precision, config.optimizer
    zero_block: dict[str, Any] = {"stage": zero.stage}
    if zero.offload_optimizer:
        zero_block["offload_optimizer"] = {"device": "cpu", "pin_memory": on_gpu}
    if zero.offload_param:
        zero_block["offload_param"] = {"device": "cpu", "pin_memory": on_gpu}

    optimizer_params: dict[str, Any] = {
        "lr": opt.lr,
        "betas": list(opt.betas),
        "eps": opt.eps,
        "weight_decay": opt.weight_decay,
    }
    if not on_gpu:
        # torch.optim.AdamW: no FusedAdam/CPUAdam op to compile on a CPU-only machine.
        optimizer_params["torch_adam"] = True

    ds: dict[str, Any] = {
        "train_batch_size": batch.global_batch_size,
        "train_micro_batch_size_per_gpu": batch.micro_batch_size,
        "gradient_accumulation_steps": batch.gradient_accumulation_steps,
        "gradient_clipping": config.train.gradient_clipping,
        "optimizer": {"type": "AdamW", "params": optimizer_params},
        "scheduler": _scheduler(config),
        "zero_optimization": zero_block,
        "bf16": {"enabled": precision.bf16},
        "fp16": {
            "enabled": precision.fp16,
            "loss_scale": 0,  # 0 = dynamic loss scaling
            "initial_scale_power": precision.initial_scale_power,
            "loss_scale_window": precision.loss_scale_window,
            "hysteresis": 2,
            "min_loss_scale": 1,
        },
        # The trainer logs its own metrics; keep DeepSpeed's periodic print out of the way.
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    tensor = tensor_degree(config)
    if tensor > 1:
        # AutoTP training from the config alone (https://www.deepspeed.ai/tutorials/autotp-training/).
        # DeepSpeed checks train_batch_size against micro x accumulation x the whole world
        # before it knows the tensor groups (DeepSpeedConfig, runtime/config.py), so it
        # gets the two it derives the rest from.
        del ds["train_batch_size"]
        ds["tensor_parallel"] = {"autotp_size": tensor}
        if config.parallel.partition_config is not None:
            ds["tensor_parallel"]["partition_config"] = config.parallel.partition_config
    if config.parallel.sequence > 1:
        # Ulysses (https://www.deepspeed.ai/tutorials/ulysses-alst-sequence-parallelism/):
        # DeepSpeed counts train_batch_size over world / sequence ranks (runtime/config.py).
        ds["sequence_parallel_size"] = config.parallel.sequence
    if not precision.fp16:
        del ds["fp16"]
    if not precision.bf16:
        del ds["bf16"]
    return ds


def _scheduler(config: Config) -> dict[str, Any]:
    sched, lr = config.scheduler, config.optimizer.lr
    if sched.kind == "cosine":
        return {
            "type": "WarmupCosineLR",
            "params": {
                "total_num_steps": config.train.steps,
                "warmup_num_steps": sched.warmup_steps,
                "warmup_min_ratio": 0.0,
                "cos_min_ratio": sched.min_lr_ratio,
                "warmup_type": "linear",
            },
        }
    return {
        "type": "WarmupLR",
        "params": {
            "warmup_min_lr": 0.0,
            "warmup_max_lr": lr,
            "warmup_num_steps": sched.warmup_steps,
            "warmup_type": "linear",
        },
    }
