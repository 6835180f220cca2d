"""The job's configuration: a typed TOML file, environment overrides and `--set key=value`.

Everything a run needs is validated here, before any process is spawned, so a bad
value costs a second and exit code 2 instead of a cluster launch. Errors are
`ConfigError`s whose message is one line naming the key, the bad value and what
would work.
"""

from __future__ import annotations

import argparse
import re
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictBool, ValidationError

from common.errors import ConfigError, Problem, describe
from training.spec.presets import PRESETS, VISION_PRESETS

DEMO_CONFIG = Path(__file__).parents[1] / "demo.toml"

# Contract (docs/contracts.md, section 3): environment variables that override config keys.
ENV_OVERRIDES = {
    "TRAIN_OUTPUT_DIR": "run.output_dir",
    "TRAIN_DATA_PATH": "data.path",
    "TRAIN_CHECKPOINT_DIR": "checkpoint.dir",
}

# Data kinds of labelled images (training/image_data.py), trained by the vision presets.
IMAGE_KINDS = ("image_folder", "image_shards")
# Data kinds of text, tokenized by a Hugging Face model's tokenizer (training/text/).
TEXT_KINDS = ("jsonl", "parquet", "text-files", "hf-dataset")
# What a Hugging Face model is trained to do (training/hf/model.py).
HF_TASKS = ("causal-lm", "masked-lm", "sequence-classification")

_IMPORT_STRING = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


def _import_string(value: str) -> str:
    if not _IMPORT_STRING.match(value):
        raise ValueError("expected 'package.module:function', e.g. 'mypkg.models:build'")
    return value


ImportString = Annotated[str, AfterValidator(_import_string)]

# A run's folder is runs/<name>: one folder name, never a path out of runs/ or runs/ itself.
_RUN_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,99}")


def _run_name(value: str) -> str:
    if not _RUN_NAME.fullmatch(value):
        raise ValueError(
            "a run name is one folder name under runs/: 1 to 100 letters, digits, '_', '-', "
            "'.' or '+', not starting with '.', '-' or '+' (no '/'), e.g. 'gpt-350m'"
        )
    return value


RunName = Annotated[str, AfterValidator(_run_name)]
# Upper bounds on counts, far above any real job, so a typo (10**21 steps) fails here.
MAX_STEPS = 10**9
MAX_BATCH = 2**24


class Section(BaseModel):
    # StrictBool fields take true/false only ("yes" is refused, not read as true);
    # NaN and infinity are refused in every float.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class RunConfig(Section):
    name: RunName = "run"
    # numpy seeds must be below 2**32; each rank seeds with seed + rank.
    seed: int = Field(default=1234, ge=0, le=2**31 - 1)
    # Empty means runs/<name>; TRAIN_OUTPUT_DIR overrides.
    output_dir: str = ""


class ModelConfig(Section):
    # A Hugging Face model and its tokenizer: a Hub id ("meta-llama/Llama-3.1-8B"), a local
    # folder, or s3://bucket/prefix holding config.json, weights and tokenizer files.
    hf: str | None = None
    task: Literal[HF_TASKS] = "causal-lm"  # type: ignore[valid-type]
    # pretrained: hf's weights; config: the same architecture, freshly initialised.
    init: Literal["pretrained", "config"] = "pretrained"
    revision: str | None = None  # a Hub branch, tag or commit of `hf`
    # Run the model's own Python from the Hub (config.json's auto_map): only when asked.
    trust_remote_code: StrictBool = False
    # sequence-classification: the number of classes (data.label_field holds 0..num_labels-1).
    num_labels: int | None = Field(default=None, gt=1)
    preset: Literal[(*PRESETS, *VISION_PRESETS)] = "tiny"  # type: ignore[valid-type]
    # "package.module:function" building your own nn.Module; see docs/training.md.
    builder: ImportString | None = None
    # Keyword arguments for `builder` (free-form: they belong to your model).
    options: dict[str, Any] = Field(default_factory=dict)
    # Overrides of the preset's shape (built-in presets, not with builder).
    n_layer: int | None = Field(default=None, gt=0, le=1024)
    n_head: int | None = Field(default=None, gt=0, le=1024)
    n_embd: int | None = Field(default=None, gt=0, le=2**17)
    dropout: float = Field(default=0.0, ge=0.0, lt=1.0)
    activation_checkpointing: StrictBool = False


class DataConfig(Section):
    # synthetic: seeded learnable sequences; tokens: a uint16/uint32 token file (nanoGPT .bin);
    # text: raw bytes of a text file as tokens (vocab 256); image_folder / image_shards:
    # labelled images in class folders / WebDataset-style tar shards (train/ and val/);
    # jsonl, parquet, text-files, hf-dataset: text for a model.hf model, tokenized by its
    # tokenizer (`python -m training prepare`).
    kind: Literal["synthetic", "tokens", "text", *IMAGE_KINDS, *TEXT_KINDS] = "synthetic"
    # "package.module:function" building your own Dataset; replaces `kind`.
    builder: ImportString | None = None
    options: dict[str, Any] = Field(default_factory=dict)
    # File, or a directory holding train.bin (tokens) / *.txt (text); for the text kinds a
    # file, a directory, a glob or s3://bucket/prefix, or a Hub dataset id (hf-dataset).
    # TRAIN_DATA_PATH overrides.
    path: str | None = None
    # Text kinds: the field holding each document's text, or (chat) its list of
    # {"role", "content"} messages, trained on the assistant's tokens only.
    text_field: str = "text"
    messages_field: str | None = None
    # sequence-classification: the field holding each document's class (an integer).
    label_field: str = "label"
    # The held-out split: a path like data.path, a Hub split, or a fraction of the documents.
    val_path: str | None = None
    val_split: str | None = None
    val_fraction: float = Field(default=0.0, ge=0, lt=1)
    # hf-dataset: the dataset's configuration (subset), split and revision.
    subset: str | None = None
    split: str = "train"
    revision: str | None = None
    # Text kinds: read and tokenize the training split while training instead of preparing
    # it first (data larger than the disk); the held-out split is still prepared.
    streaming: StrictBool = False
    dtype: Literal["uint16", "uint32"] = "uint16"
    seq_len: int = Field(default=256, gt=0, le=2**24)
    # Defaults: 50304 (GPT-2's vocabulary padded to a multiple of 64) for synthetic and tokens.
    vocab_size: int | None = Field(default=None, gt=1, le=2**24)
    synthetic_samples: int = Field(default=100_000, gt=0, le=10**12)
    # Encoder presets (bert-*): the fraction of tokens hidden for the model to predict.
    mask_prob: float = Field(default=0.15, gt=0, lt=1)
    # DataLoader processes per rank; "auto": the machine's CPUs shared by its ranks, one
    # kept for each rank itself, at most 10 (training/data.py, data_workers).
    num_workers: Annotated[int, Field(ge=0, le=256)] | Literal["auto"] = 0
    # Image kinds: the side of the square crop the model sees, and the number of classes.
    image_size: int = Field(default=224, ge=16, le=8192)
    num_classes: int | None = Field(default=None, gt=1)


class TrainConfig(Section):
    steps: int = Field(default=1000, gt=0, le=MAX_STEPS)
    # Give any two of these three (world size is known at launch); all three must agree.
    global_batch_size: int | None = Field(default=None, gt=0, le=MAX_BATCH)
    micro_batch_size: int | None = Field(default=None, gt=0, le=MAX_BATCH)
    gradient_accumulation_steps: int | None = Field(default=None, gt=0, le=MAX_BATCH)
    gradient_clipping: float = Field(default=1.0, ge=0.0)


class OptimizerConfig(Section):
    lr: float = Field(default=6e-4, gt=0)
    weight_decay: float = Field(default=0.1, ge=0)
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = Field(default=1e-8, gt=0)


class SchedulerConfig(Section):
    # cosine: WarmupCosineLR (warmup, then cosine decay to min_lr_ratio at train.steps);
    # constant: WarmupLR (warmup, then hold lr).
    kind: Literal["cosine", "constant"] = "cosine"
    warmup_steps: int = Field(default=100, ge=1, le=MAX_STEPS)
    min_lr_ratio: float = Field(default=0.1, ge=0, le=1)


class ZeroConfig(Section):
    stage: int = Field(default=2, ge=0, le=3)
    offload_optimizer: StrictBool = False
    offload_param: StrictBool = False


class PrecisionConfig(Section):
    bf16: StrictBool = False
    fp16: StrictBool = False
    # fp16 dynamic loss scaling: start at 2**initial_scale_power, grow after this many good steps.
    initial_scale_power: int = Field(default=16, ge=0, le=64)
    loss_scale_window: int = Field(default=1000, gt=0, le=MAX_STEPS)


class CheckpointConfig(Section):
    every_steps: int = Field(default=1000, gt=0, le=MAX_STEPS)
    keep_last: int = Field(default=3, gt=0, le=1000)
    # Training waits only while the state is copied to host memory; the write, fsync,
    # commit and upload go on in the background (docs/checkpoints.md).
    asynchronous: StrictBool = True
    # Empty means <output_dir>/checkpoints; TRAIN_CHECKPOINT_DIR overrides.
    dir: str = ""


class LoggingConfig(Section):
    every_steps: int = Field(default=10, gt=0, le=MAX_STEPS)
    # Image kinds: top-1 accuracy on the held-out split (val/) every this many steps and at
    # the end.
    eval_every_steps: int = Field(default=1000, gt=0, le=MAX_STEPS)
    tensorboard: StrictBool = True
    progress_bar: StrictBool = True


class WatchdogConfig(Section):
    """Hang and straggler detection (training/watchdog.py, training/stragglers.py)."""

    # A hang: no rank finished a step (or a part of a checkpoint save) for max(hang_floor_s,
    # hang_step_factor x the measured step time); before this run's first step (model
    # build, checkpoint load) for hang_startup_s. The floor covers evaluations and each
    # part of a save (a save counts as progress file by file, stage by stage).
    hang_floor_s: float = Field(default=600.0, gt=0)
    hang_step_factor: float = Field(default=10.0, ge=1)
    hang_startup_s: float = Field(default=1800.0, gt=0)
    # A straggler: a rank whose local work per step is this many times the median rank's,
    # in straggler_windows logging windows in a row.
    straggler_factor: float = Field(default=1.5, gt=1)
    straggler_windows: int = Field(default=3, gt=0)


def _rank_count_or_auto(value: int | str) -> int | str:
    if value == "auto" or (isinstance(value, int) and value > 0):
        return value
    raise ValueError('expected a number of ranks (1, 2, 4, 8) or "auto"')


class ParallelConfig(Section):
    """Model parallelism (training/spec/parallel.py): ranks that split each layer (DeepSpeed
    AutoTP) or each sequence (Ulysses); data parallelism is what is left of the world."""

    # Ranks that split each layer, within one node; "auto": chosen from the model's size,
    # the GPUs' memory, the node's interconnect and the sequence length.
    tensor: Annotated[int | str, AfterValidator(_rank_count_or_auto)] = 1
    # Ranks that split each sequence (DeepSpeed Ulysses).
    sequence: int = Field(default=1, gt=0)
    # For a model with neither a tp_plan nor a DeepSpeed preset: DeepSpeed's
    # tensor_parallel.partition_config ({"layer_specs": [{"patterns": [...],
    # "partition_type": "column" | "row"}, ...]}), passed as given.
    partition_config: dict[str, Any] | None = None


class Config(Section):
    run: RunConfig = Field(default_factory=RunConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    optimizer: OptimizerConfig = Field(default_factory=OptimizerConfig)
    scheduler: SchedulerConfig = Field(default_factory=SchedulerConfig)
    zero: ZeroConfig = Field(default_factory=ZeroConfig)
    precision: PrecisionConfig = Field(default_factory=PrecisionConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    watchdog: WatchdogConfig = Field(default_factory=WatchdogConfig)
    parallel: ParallelConfig = Field(default_factory=ParallelConfig)

    @property
    def output_dir(self) -> Path:
        return Path(self.run.output_dir or f"runs/{self.run.name}")

    @property
    def checkpoint_dir(self) -> Path:
        return Path(self.checkpoint.dir) if self.checkpoint.dir else self.output_dir / "checkpoints"

    @property
    def is_image(self) -> bool:
        return self.data.kind in IMAGE_KINDS

    @property
    def is_hf(self) -> bool:
        """The model is a Hugging Face model (model.hf)."""
        return self.model.hf is not None

    @property
    def is_text(self) -> bool:
        """The data is text tokenized by the model's tokenizer."""
        return self.data.kind in TEXT_KINDS and self.data.builder is None

    @property
    def vocab_size(self) -> int:
        if self.data.kind == "text" and self.data.builder is None:
            return 256
        return self.data.vocab_size or 50304


class BatchSizes(BaseModel):
    """The three batch sizes DeepSpeed needs, consistent with the world size."""

    global_batch_size: int
    micro_batch_size: int
    gradient_accumulation_steps: int


def add_overrides_argument(
    parser: argparse.ArgumentParser,
    help: str = "override one config key, e.g. --set train.steps=100 (repeatable)",
) -> None:
    """`--set KEY=VALUE` (repeatable) into `overrides`, as load_config takes them."""
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help=help
    )


def load_config(
    path: str | Path | None,
    overrides: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
) -> Config:
    """Read the TOML file (the demo job's when `path` is None), then the ENV_OVERRIDES
    variables set in `env` (the trainer's: TrainerEnv.config_paths), then `--set` values."""
    env = env or {}
    source = Path(path) if path else DEMO_CONFIG
    try:
        raw = tomllib.loads(source.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file {source} does not exist") from None
    except IsADirectoryError:
        raise ConfigError(f"config file {source} is a folder: give a TOML file in it") from None
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"config file {source} cannot be read: {error}") from None
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"config file {source} is not valid TOML: {error}") from None
    for variable, key in ENV_OVERRIDES.items():
        if env.get(variable):
            _set_key(raw, key, env[variable])
    for item in overrides:
        key, value = _parse_override(item)
        _set_key(raw, key, value)
    try:
        return Config.model_validate(raw)
    except ValidationError as error:
        raise ConfigError(describe(error, known=_known_keys)) from None


def validate(config: Config, world_size: int, gpus_per_node: int | None = None) -> BatchSizes:
    """Reject impossible combinations; return the resolved batch sizes (over the
    data-parallel ranks: world / (parallel.tensor x parallel.sequence)).
    ``gpus_per_node`` None: the world is one node."""
    zero, precision = config.zero, config.precision
    if precision.bf16 and precision.fp16:
        raise ConfigError(
            "precision.fp16 = true and precision.bf16 = true: choose one (bf16 on A100/H100, "
            "fp16 on V100/T4)"
        )
    if zero.offload_param and zero.stage != 3:
        raise ConfigError(
            f"zero.offload_param = true needs zero.stage = 3 (got {zero.stage}): "
            "only ZeRO-3 partitions parameters"
        )
    if zero.offload_optimizer and zero.stage == 0:
        raise ConfigError(
            "zero.offload_optimizer = true needs zero.stage 1, 2 or 3 (got 0): "
            "without ZeRO there is no optimizer partition to offload"
        )
    if config.model.builder is None and config.model.options:
        raise ConfigError(
            "model.options is set but model.builder is not: options go to your own model's builder"
        )
    if config.data.builder is None and config.data.options:
        raise ConfigError(
            "data.options is set but data.builder is not: options go to your own dataset's builder"
        )
    if config.data.builder is None and config.data.kind != "synthetic" and not config.data.path:
        raise ConfigError(
            f"data.kind = {config.data.kind!r} needs data.path (or TRAIN_DATA_PATH): "
            "a file or directory to read"
        )
    if config.data.kind == "text" and config.data.vocab_size not in (None, 256):
        raise ConfigError(
            f"data.vocab_size = {config.data.vocab_size} with data.kind = 'text': "
            "text is read as bytes, so the vocabulary is 256 (remove the key)"
        )
    _check_hf(config)
    _check_workload(config)
    if config.model.builder is None and not config.is_hf and config.model.preset in PRESETS:
        shape = PRESETS[config.model.preset] | {
            key: value
            for key in ("n_layer", "n_head", "n_embd")
            if (value := getattr(config.model, key)) is not None
        }
        if shape["n_embd"] % shape["n_head"]:
            raise ConfigError(
                f"model.n_embd = {shape['n_embd']} is not divisible by model.n_head = "
                f"{shape['n_head']}: pick a head count that divides the width"
            )
    if config.scheduler.kind == "cosine" and config.scheduler.warmup_steps >= config.train.steps:
        raise ConfigError(
            f"scheduler.warmup_steps = {config.scheduler.warmup_steps} is not below train.steps "
            f"= {config.train.steps}: the cosine schedule needs steps after warmup "
            "(lower warmup_steps or use scheduler.kind = 'constant')"
        )
    return resolve_batch_sizes(config.train, check_layout(config, world_size, gpus_per_node))


def check_layout(config: Config, world_size: int, gpus_per_node: int | None = None) -> int:
    """The [parallel] layout's checks that need no model files (training/spec/parallel.py
    has the model's); the data-parallel ranks. ``gpus_per_node`` None: one node."""
    # "auto" counts as 1 until the launcher chose.
    tensor = 1 if config.parallel.tensor == "auto" else config.parallel.tensor
    sequence = config.parallel.sequence
    gpus_per_node = gpus_per_node or world_size
    if tensor > 1 and sequence > 1:
        raise ConfigError(
            f"parallel.tensor = {tensor} with parallel.sequence = {sequence}: DeepSpeed does "
            "not document AutoTP and Ulysses together; choose one (tensor for a model too big "
            "for a GPU, sequence for sequences too long for one)"
        )
    if world_size % (tensor * sequence):
        raise ConfigError(
            f"parallel.tensor x parallel.sequence = {tensor} x {sequence} = "
            f"{tensor * sequence} does not divide the world size {world_size}: use a divisor "
            f"of {world_size} (the data-parallel ranks are world / (tensor x sequence))"
        )
    if tensor > gpus_per_node:
        raise ConfigError(
            f"parallel.tensor = {tensor} is more than the {gpus_per_node} GPUs of one node: a "
            "tensor group all-reduces inside every layer and must stay on one node's NVLink; "
            f"use parallel.tensor <= {gpus_per_node}"
        )
    if config.data.seq_len % sequence:
        raise ConfigError(
            f"data.seq_len = {config.data.seq_len} is not a multiple of parallel.sequence = "
            f"{sequence}: each rank takes an equal slice of every sequence"
        )
    if (tensor > 1 or config.parallel.tensor == "auto") and not config.is_hf:
        raise ConfigError(
            f"parallel.tensor = {config.parallel.tensor!r} needs a Hugging Face model "
            "(model.hf): DeepSpeed's AutoTP splits a transformers model's layers by their names"
        )
    if sequence > 1 and not config.is_hf:
        raise ConfigError(
            f"parallel.sequence = {sequence} needs a Hugging Face model (model.hf): Ulysses "
            "replaces a transformers model's attention"
        )
    if sequence > 1 and config.model.task != "causal-lm":
        raise ConfigError(
            f"parallel.sequence = {sequence} needs model.task = 'causal-lm', not "
            f"{config.model.task!r}: Ulysses attends causally over the gathered sequence and "
            "sums a loss per token; use parallel.sequence = 1"
        )
    if config.parallel.partition_config is not None and config.parallel.tensor == 1:
        raise ConfigError(
            "parallel.partition_config is set but parallel.tensor = 1: it says how "
            "tensor-parallel ranks split the layers (set parallel.tensor)"
        )
    return world_size // (tensor * sequence)


def _check_workload(config: Config) -> None:
    """The model and the data must be of one kind: images for a vision preset, tokens else."""
    model, data = config.model, config.data
    vision = model.builder is None and model.preset in VISION_PRESETS
    if vision and not config.is_image:
        raise ConfigError(
            f"model.preset = {model.preset!r} classifies images but data.kind = {data.kind!r}: "
            f"use data.kind = 'image_folder' or 'image_shards'"
        )
    if config.is_image and model.builder is None and not vision:
        raise ConfigError(
            f"data.kind = {data.kind!r} holds images but model.preset = {model.preset!r} is a "
            f"language model: use one of {', '.join(VISION_PRESETS)}"
        )
    if config.is_image and data.num_classes is None:
        raise ConfigError(
            f"data.kind = {data.kind!r} needs data.num_classes: the number of labels "
            "(class folders, or the largest .cls value + 1)"
        )
    if vision and model.activation_checkpointing:
        raise ConfigError(
            f"model.activation_checkpointing = true is for the transformer presets, not "
            f"{model.preset!r} (recomputing BatchNorm would count its statistics twice): "
            "lower train.micro_batch_size instead"
        )
    if vision and config.zero.stage == 3:
        raise ConfigError(
            f"zero.stage = 3 with model.preset = {model.preset!r}: the image models are not "
            "built for partitioned parameters (and a ResNet's 11-26M parameters fit every GPU); "
            "use zero.stage 0, 1 or 2, with zero.offload_optimizer = true for less memory"
        )
    readers_of_s3 = ("image_shards", "jsonl", "parquet", "text-files")
    for key in ("path", "val_path"):
        value = getattr(data, key)
        if value and value.startswith("s3://") and data.kind not in readers_of_s3:
            raise ConfigError(
                f"data.{key} = {value!r}: data.kind = {data.kind!r} does not read from S3 "
                f"(these do: {', '.join(readers_of_s3)}); sync it to a local directory "
                "(gpu:dataS3Uri does on the stack)"
            )


def _check_hf(config: Config) -> None:
    """A Hugging Face model takes its shape from config.json and its tokens from its
    tokenizer; the text kinds need one. Checks that need the model's files run in the
    launcher (training/hf/checks.py)."""
    model, data = config.model, config.data
    if config.is_text and not config.is_hf:
        raise ConfigError(
            f"data.kind = {data.kind!r} is text for a Hugging Face model's tokenizer: set "
            "model.hf (a Hub id, a local folder or s3://...)"
        )
    text_only = {
        "messages_field": data.messages_field is not None,
        "val_path": data.val_path is not None,
        "val_split": data.val_split is not None,
        "val_fraction": data.val_fraction > 0,
        "streaming": data.streaming,
    }
    for key, given in text_only.items():
        if given and not config.is_text:
            raise ConfigError(
                f"data.{key} is set but data.kind = {data.kind!r}: it applies to the text "
                f"kinds ({', '.join(TEXT_KINDS)})"
            )
    for key in ("subset", "val_split"):
        if getattr(data, key) is not None and data.kind != "hf-dataset":
            raise ConfigError(
                f"data.{key} is set but data.kind = {data.kind!r}: it names a part of a Hub "
                "dataset (data.kind = 'hf-dataset')"
            )
    held_out = [key for key in ("val_path", "val_split") if getattr(data, key) is not None]
    if data.val_fraction > 0:
        held_out.append("val_fraction")
    if len(held_out) > 1:
        raise ConfigError(
            f"data.{' and data.'.join(held_out)} are both set: give the held-out split one way"
        )
    if data.streaming and data.val_fraction > 0:
        raise ConfigError(
            "data.val_fraction with data.streaming = true: a streamed split is never read "
            "whole, so hold out a split of its own (data.val_path or data.val_split)"
        )
    if not config.is_hf:
        for key in ("task", "init", "revision", "trust_remote_code", "num_labels"):
            if key in model.model_fields_set:
                raise ConfigError(f"model.{key} is set but model.hf is not: it applies to model.hf")
        return
    for key in ("preset", "builder", "n_layer", "n_head", "n_embd", "dropout"):
        if key in model.model_fields_set:
            raise ConfigError(
                f"model.{key} and model.hf are both set: a Hugging Face model's shape comes "
                f"from its config.json; remove model.{key}"
            )
    if config.is_image or data.kind == "text":
        raise ConfigError(
            f"data.kind = {data.kind!r} with model.hf: use a text kind "
            f"({', '.join(TEXT_KINDS)}) to tokenize with the model's tokenizer"
        )
    classifying = model.task == "sequence-classification"
    if classifying and model.num_labels is None:
        raise ConfigError(
            "model.task = 'sequence-classification' needs model.num_labels: the number of "
            f"classes in data.{data.label_field}"
        )
    if model.num_labels is not None and not classifying:
        raise ConfigError(
            f"model.num_labels is set but model.task = {model.task!r}: it applies to "
            "'sequence-classification'"
        )
    if data.messages_field is not None and model.task != "causal-lm":
        raise ConfigError(
            f"data.messages_field with model.task = {model.task!r}: chat data trains a "
            "causal-lm on the assistant's turns"
        )
    if model.task != "causal-lm" and not config.is_text:
        raise ConfigError(
            f"model.task = {model.task!r} with data.kind = {data.kind!r}: it is trained on "
            f"documents the model's tokenizer encodes ({', '.join(TEXT_KINDS)})"
        )
    if data.streaming and model.task != "causal-lm":
        raise ConfigError(
            f"data.streaming = true with model.task = {model.task!r}: streaming packs text for "
            "a causal-lm; prepare the data instead (data.streaming = false)"
        )


def resolve_batch_sizes(train: TrainConfig, world_size: int) -> BatchSizes:
    """global = micro x accumulation x world size; any two given determine the third."""
    total, micro, accum = (
        train.global_batch_size,
        train.micro_batch_size,
        train.gradient_accumulation_steps,
    )
    if total is None:
        micro, accum = micro or 1, accum or 1
        total = micro * accum * world_size
    elif micro is None and accum is None:
        accum = 1
        micro = _divide(total, world_size, "world size")
    elif micro is None:
        micro = _divide(total, accum * world_size, "gradient_accumulation_steps x world size")
    elif accum is None:
        accum = _divide(total, micro * world_size, "micro_batch_size x world size")
    elif total != micro * accum * world_size:
        raise ConfigError(
            f"train.global_batch_size = {total} but micro_batch_size x "
            f"gradient_accumulation_steps x world size = {micro} x {accum} x {world_size} = "
            f"{micro * accum * world_size}: give only two of the three, or make them agree"
        )
    return BatchSizes(
        global_batch_size=total, micro_batch_size=micro, gradient_accumulation_steps=accum
    )


def _divide(total: int, divisor: int, what: str) -> int:
    if total % divisor:
        raise ConfigError(
            f"train.global_batch_size = {total} is not divisible by {what} = {divisor}: "
            f"use a multiple of {divisor}"
        )
    return total // divisor


def _parse_override(item: str) -> tuple[str, Any]:
    key, sep, text = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set {item!r}: expected key.sub=value, e.g. --set train.steps=100")
    try:
        value = tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        value = text  # a bare word such as run.name=demo: take it as a string
    return key.strip(), value


def _set_key(raw: dict, key: str, value: Any) -> None:
    *parents, leaf = key.split(".")
    node = raw
    for part in parents:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{key}: {part} is a value, not a section")
        node = child
    node[leaf] = value


def _known_keys(problem: Problem) -> str:
    """The keys of the section an unknown key sits in."""
    model: type[BaseModel] = Config
    for part in problem.location[:-1]:
        annotation = model.model_fields[part].annotation
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return "?"
        model = annotation
    return ", ".join(model.model_fields)
