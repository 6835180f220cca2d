"""Build the model and dataset a config names: built-in ones, or the user's own through
"package.module:function" import strings (`model.builder`, `data.builder`).

Your own builders are called as

    model = build(**model.options, vocab_size=..., seq_len=...)   -> nn.Module
    dataset = build(**data.options, seq_len=..., seed=..., vocab_size=...)  -> Dataset

The module's forward(inputs, targets) returns the scalar loss; each dataset item is an
(inputs, targets) pair of LongTensors. See examples/custom_model/. The vision presets
(resnet-*) train on labelled images instead (training/image_data.py), and are evaluated on
the held-out split (build_eval_dataset).
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from torch import nn
from torch.utils.data import Dataset

from training.data import (
    MaskedTokens,
    SyntheticSequences,
    sampled_max_token,
    text_bytes,
    token_file,
)
from training.environment import check_writable_dir
from training.inputs import JobInputs
from training.model import build_gpt, mask_token_id
from training.spec.config import Config, ConfigError
from training.spec.presets import ENCODER_PRESETS, VISION_PRESETS
from training.text.sources import has_split


def resolve(import_string: str, key: str) -> Callable:
    """The callable named by "package.module:function"; ConfigError naming `key` otherwise."""
    module_name, _, attribute = import_string.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        raise ConfigError(
            f"{key} = {import_string!r}: cannot import {module_name} ({error}); "
            "put its package on PYTHONPATH or run from its parent directory"
        ) from None
    except Exception as error:  # the module itself fails: a SyntaxError, a raise at import
        said = " ".join(str(error).split())  # one line, whatever the exception's text
        raise ConfigError(
            f"{key} = {import_string!r}: cannot import {module_name}, importing it raised "
            f"{type(error).__name__}: {said}; fix the module"
        ) from None
    builder = getattr(module, attribute, None)
    if not callable(builder):
        raise ConfigError(f"{key} = {import_string!r}: {module_name} has no function {attribute!r}")
    return builder


def preflight(config: Config) -> None:
    """Checks that need imports or files, run by the launcher so they fail once, before any
    rank starts: the user's builders import, the data is there and readable, the run and
    checkpoint folders can be written."""
    check_writable_dir("run.output_dir (or TRAIN_OUTPUT_DIR)", config.output_dir)
    check_writable_dir("checkpoint.dir (or TRAIN_CHECKPOINT_DIR)", config.checkpoint_dir)
    if config.model.builder:
        build = resolve(config.model.builder, "model.builder")
        _check_arguments(build, model_builder_arguments(config), "model", config.model.builder)
    if config.data.builder:
        build = resolve(config.data.builder, "data.builder")
        _check_arguments(build, data_builder_arguments(config), "data", config.data.builder)
    elif (
        not config.is_text  # globs and Hub ids too: training/inputs.py reads text data
        and config.data.path
        and not config.data.path.startswith("s3://")
        and not Path(config.data.path).exists()
    ):
        raise ConfigError(
            f"data.path = {config.data.path!r} does not exist: point it (or TRAIN_DATA_PATH) "
            "at a file or directory"
        )
    elif config.data.kind == "tokens" and not config.data.path.startswith("s3://"):
        file = Path(config.data.path)
        check_token_ids(file / "train.bin" if file.is_dir() else file, config)
    elif config.data.kind == "image_folder" and not config.data.path.startswith("s3://"):
        train = Path(config.data.path) / "train"
        if not train.is_dir():
            raise ConfigError(
                f"data.path = {config.data.path!r} (or TRAIN_DATA_PATH) has no train/ folder: "
                "it needs train/<class>/<image> (and val/<class>/<image> to evaluate)"
            )


def model_builder_arguments(config: Config) -> dict:
    """What model.builder is called with: the user's options and the data's shape."""
    return {
        **config.model.options,
        "vocab_size": config.vocab_size,
        "seq_len": config.data.seq_len,
    }


def data_builder_arguments(config: Config) -> dict:
    data = config.data
    return {
        **data.options,
        "seq_len": data.seq_len,
        "seed": config.run.seed,
        "vocab_size": config.vocab_size,
    }


def _check_arguments(build: Callable, arguments: dict, section: str, name: str) -> None:
    """A typo in {section}.options fails here, not as a TypeError on every rank."""
    try:
        signature = inspect.signature(build)
    except (TypeError, ValueError):
        return  # a builtin or C callable: nothing to read
    try:
        signature.bind(**arguments)
    except TypeError as error:
        raise ConfigError(
            f"{section}.options do not fit {section}.builder = {name!r} {signature}: {error}; "
            f"fix the key in {section}.options"
        ) from None


def check_token_ids(file: Path, config: Config) -> None:
    """Refuse a token file that holds no whole window of tokens or whose ids reach
    vocab_size (from an evenly spread sample)."""
    if not file.is_file():
        raise ConfigError(
            f"data.path = {config.data.path!r} (or TRAIN_DATA_PATH): {file} does not exist: "
            "point it at a token .bin file or a folder holding train.bin"
        )
    size, itemsize = file.stat().st_size, np.dtype(config.data.dtype).itemsize
    if size % itemsize:
        raise ConfigError(
            f"data.path {file} (or TRAIN_DATA_PATH) holds {size} bytes, not a whole number of "
            f"{config.data.dtype} tokens ({itemsize} bytes each): check data.dtype, or the "
            "file was cut short"
        )
    if size // itemsize <= config.data.seq_len:
        raise ConfigError(
            f"data.path {file} (or TRAIN_DATA_PATH) holds {size // itemsize} tokens, fewer than "
            f"one window of data.seq_len + 1 = {config.data.seq_len + 1}: give it more tokens "
            "or lower data.seq_len"
        )
    largest = sampled_max_token(file, config.data.dtype)
    if largest is not None and largest >= config.vocab_size:
        raise ConfigError(
            f"data.path {file} holds token id {largest}, not below data.vocab_size = "
            f"{config.vocab_size}: set data.vocab_size to at least {largest + 1} (or the "
            "tokenizer's vocabulary size), or check data.dtype"
        )


def build_model(
    config: Config, ds_config: dict[str, Any] | None = None, inputs: JobInputs | None = None
) -> nn.Module:
    """The config's model; at ZeRO-3 (with `ds_config`) created partitioned across the
    ranks (deepspeed.zero.Init): each parameter is split as soon as its module is built,
    so no rank ever holds the whole model. A model.hf model is built from its files on
    this node (`inputs`, training/inputs.py), by training/hf/model.py."""
    if config.is_hf:
        import torch

        from training.hf.model import build

        folder = (inputs or JobInputs()).model_folder
        if folder is None:
            raise ValueError("a model.hf model is built from its fetched folder (JobInputs)")
        return build(config, folder, ds_config, on_gpu=torch.cuda.is_available())
    with _partitioned(config, ds_config):
        return _build_model(config)


def _partitioned(config: Config, ds_config: dict[str, Any] | None):
    if ds_config is None or config.zero.stage != 3:
        return contextlib.nullcontext()
    import deepspeed

    return deepspeed.zero.Init(config_dict_or_path=ds_config)


def _build_model(config: Config) -> nn.Module:
    model_cfg, seq_len = config.model, config.data.seq_len
    if model_cfg.preset in VISION_PRESETS and not model_cfg.builder:
        from training.vision import build_resnet

        return build_resnet(model_cfg.preset, num_classes=config.data.num_classes)
    if model_cfg.builder:
        build = resolve(model_cfg.builder, "model.builder")
        return build(**model_builder_arguments(config))
    return build_gpt(
        model_cfg.preset,
        vocab_size=config.vocab_size,
        seq_len=seq_len,
        dropout=model_cfg.dropout,
        activation_checkpointing=model_cfg.activation_checkpointing,
        n_layer=model_cfg.n_layer,
        n_head=model_cfg.n_head,
        n_embd=model_cfg.n_embd,
    )


def build_dataset(
    config: Config, inputs: JobInputs | None = None, *, rank: int = 0, world_size: int = 1
) -> Dataset:
    """The training samples; a streamed text split is this rank's share of it."""
    if config.is_image:
        return _image_datasets(config)[0]
    if config.is_text and config.data.streaming:
        from training.text.stream import StreamedWindows

        folder = (inputs or JobInputs()).model_folder
        return StreamedWindows(config, folder, rank=rank, world_size=world_size)
    if config.is_text:
        return _text_dataset(config, inputs, "train")
    dataset = _token_dataset(config)
    if config.model.builder is None and config.model.preset in ENCODER_PRESETS:
        dataset = MaskedTokens(
            dataset,
            mask_id=mask_token_id(config.vocab_size),
            mask_prob=config.data.mask_prob,
            seed=config.run.seed,
        )
    return dataset


def build_eval_dataset(config: Config, inputs: JobInputs | None = None) -> Dataset | None:
    """The held-out split the trainer reports loss and accuracy on; None without one."""
    if config.is_image:
        return _image_datasets(config)[1]
    if config.is_text and has_split(config, "val"):
        return _text_dataset(config, inputs, "val")
    return None


def _text_dataset(config: Config, inputs: JobInputs | None, split: str) -> Dataset:
    """Samples of a prepared split (training/text/packing.py)."""
    from training.text.packing import Split, samples

    folder = (inputs or JobInputs()).data_folder
    if folder is None:
        raise ValueError("text data is read from its prepared folder (JobInputs)")
    return samples(Split(folder, split), config)


def _image_datasets(config: Config) -> tuple[Dataset, Dataset]:
    from training.image_data import image_datasets

    data = config.data
    try:
        return image_datasets(
            data.kind,
            data.path,
            image_size=data.image_size,
            num_classes=data.num_classes,
            seed=config.run.seed,
        )
    except ValueError as error:  # missing split, no images, labels out of range
        raise ConfigError(f"data.path = {data.path!r}: {error}") from None


def _token_dataset(config: Config) -> Dataset:
    data = config.data
    if data.builder:
        build = resolve(data.builder, "data.builder")
        return build(**data_builder_arguments(config))
    if data.kind == "synthetic":
        return SyntheticSequences(
            vocab_size=config.vocab_size,
            seq_len=data.seq_len,
            num_samples=data.synthetic_samples,
            seed=config.run.seed,
        )
    try:
        if data.kind == "tokens":
            return token_file(
                Path(data.path),
                dtype=data.dtype,
                seq_len=data.seq_len,
                vocab_size=config.vocab_size,
            )
        return text_bytes(Path(data.path), seq_len=data.seq_len)
    except ValueError as error:  # the file is missing, empty or too short: a config problem
        raise ConfigError(str(error)) from None
