"""The DeepSpeed engine for a job, built one way: seed, model, optimizer groups, initialize.

The trainer builds every rank's engine with `build_engine`; the benchmarks and tests
that compare against the trainer call the same function, so that what they measure is
the engine the trainer runs, not a copy of its recipe.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import deepspeed
import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from training.components import build_model
from training.ds_config import build_ds_config
from training.inputs import JobInputs
from training.private_apis import compile_when_first_called
from training.spec.config import BatchSizes, Config
from training.spec.parallel import split_source


def build_engine(
    config: Config,
    batch: BatchSizes,
    *,
    on_gpu: bool,
    load_universal: bool = False,
    inputs: JobInputs | None = None,
) -> deepspeed.DeepSpeedEngine:
    """The job's engine on this rank, inside an initialized process group.

    Every rank seeds with run.seed before building the model, so all start from the same
    weights; the caller reseeds per rank afterwards if randomness should differ.
    ``load_universal``: DeepSpeed loads the checkpoint as a universal one
    (training.checkpoint.resume.ResumePoint.deepspeed_loads_universal). ``inputs``: a
    model.hf model's files on this node (training/inputs.py)."""
    ds_config = build_ds_config(config, batch, on_gpu=on_gpu)
    return initialize(
        lambda: build_model(config, ds_config, inputs),
        ds_config,
        seed=config.run.seed,
        weight_decay=config.optimizer.weight_decay,
        load_universal=load_universal,
    )


def initialize(
    make_model: Callable[[], nn.Module],
    ds_config: dict,
    *,
    seed: int,
    weight_decay: float = 0.0,
    load_universal: bool = False,
) -> deepspeed.DeepSpeedEngine:
    """The recipe every engine follows: seed, build the model, ``deepspeed.initialize`` with
    weight decay on matrices only; tests with a model of their own call it too.

    DeepSpeed reads ``checkpoint.load_universal`` once, here
    (https://www.deepspeed.ai/tutorials/universal-checkpointing/)."""
    if load_universal:
        ds_config = {
            **ds_config,
            "checkpoint": {**ds_config.get("checkpoint", {}), "load_universal": True},
        }
    compile_when_first_called()  # before deepspeed.initialize imports the Muon optimizer
    seed_everything(seed)
    model = make_model()
    if "tensor_parallel" in ds_config:
        ds_config = {**ds_config, "tensor_parallel": autotp_settings(ds_config, model)}
    groups = None
    if ds_config.get("sequence_parallel_size", 1) > 1:
        # Ulysses: the model installs its attention and its slicing (training/hf/model.py).
        groups = model.split_sequences(
            ds_config["sequence_parallel_size"], ds_config["train_micro_batch_size_per_gpu"]
        )
    engine, *_ = deepspeed.initialize(
        model=model,
        model_parameters=param_groups(model, weight_decay),
        config=ds_config,
        mpu=groups,
    )
    return engine


def autotp_settings(ds_config: dict, model: nn.Module) -> dict:
    """The config's tensor_parallel block, with DeepSpeed's preset for the model's type when
    its config has no tp_plan to split by (training/spec/parallel.py)."""
    settings = dict(ds_config["tensor_parallel"])
    hf_config = getattr(model, "config", None)
    by_preset = hf_config is not None and split_source(None, hf_config) == "preset"
    if by_preset and "partition_config" not in settings:
        settings["preset_model"] = hf_config.model_type
    return settings


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Weight decay on matrices only, not on biases, norms (nanoGPT's split)."""
    params = [p for p in model.parameters() if p.requires_grad]
    # A ZeRO-3 partitioned parameter keeps its full shape in ds_shape.
    matrices = [p for p in params if len(getattr(p, "ds_shape", p.shape)) >= 2]
    others = [p for p in params if len(getattr(p, "ds_shape", p.shape)) < 2]
    return [
        {"params": matrices, "weight_decay": weight_decay},
        {"params": others, "weight_decay": 0.0},
    ]


def seed_everything(seed: int) -> None:
    """Python's, NumPy's and torch's global generators, from one seed."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def mean_over_ranks(value: torch.Tensor) -> float:
    """The value's mean over all ranks: a collective every rank must call."""
    total = value.clone()
    dist.all_reduce(total)
    return total.item() / dist.get_world_size()
