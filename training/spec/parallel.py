"""The job's layout: ranks that split each layer (tensor), each sequence (sequence), and
the data-parallel ranks left over; and the checks a layout must pass before any GPU is
rented (`estimate`, the stack's `plan`, the launcher), each a one-line ConfigError.

Tensor parallelism is DeepSpeed's AutoTP training (``tensor_parallel.autotp_size``,
https://www.deepspeed.ai/tutorials/autotp-training/): each rank of a tensor group holds a
slice of every split layer and the group all-reduces inside each layer, twice per layer
and pass, so the group stays within a node (NVLink, not the network). The layers split
follow the model's Hugging Face ``tp_plan`` (config.json's ``base_model_tp_plan``), else a
DeepSpeed preset for its model_type, else the job's ``parallel.partition_config``
(DeepSpeed's ``tensor_parallel.partition_config``: precedence partition_config > tp_plan >
preset, deepspeed/runtime/tensor_parallel/config.py).

Pipeline parallelism is left out: DeepSpeed's pipeline engine refuses ZeRO-2 and -3
("ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism",
deepspeed/runtime/pipe/engine.py) and needs the model rewritten as a PipelineModule of
layer specs, which a Hugging Face model is not.
"""

from __future__ import annotations

from dataclasses import dataclass

from common.errors import ConfigError
from training.spec.config import Config

# DeepSpeed's AutoTP presets by model_type (AutoTPPresets.get_preset,
# deepspeed/module_inject/autotp_config.py, DeepSpeed 0.19.8).
AUTOTP_PRESETS = ("llama", "bloom", "chatglm", "mixtral", "deepseek_v2", "qwen2", "phi3")


@dataclass(frozen=True)
class Layout:
    tensor: int
    sequence: int
    data: int

    def describe(self) -> str:
        return f"tensor {self.tensor} x sequence {self.sequence} x data {self.data}"


def tensor_degree(config: Config) -> int:
    """parallel.tensor once resolved; "auto" counts as 1 until the trainer chose."""
    tensor = config.parallel.tensor
    return 1 if tensor == "auto" else tensor


def layout(config: Config, world_size: int) -> Layout:
    tensor, sequence = tensor_degree(config), config.parallel.sequence
    return Layout(tensor, sequence, world_size // (tensor * sequence))


def check_layout(config: Config, world_size: int, gpus_per_node: int | None = None) -> Layout:
    """The layout's checks that need no model files; `gpus_per_node` None: one node."""
    tensor, sequence = tensor_degree(config), config.parallel.sequence
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
    if sequence > 1:
        # DeepSpeed's Ulysses needs its attention adapter registered before the model is
        # built, its data loader adapter and a token-weighted loss across the sequence group
        # (https://www.deepspeed.ai/tutorials/ulysses-alst-sequence-parallelism/): not
        # wired here yet, so a run would silently train on duplicated batches.
        raise ConfigError(
            f"parallel.sequence = {sequence}: this trainer does not run DeepSpeed Ulysses "
            "sequence parallelism yet; use parallel.sequence = 1 (parallel.tensor splits "
            "activations too)"
        )
    if config.parallel.partition_config is not None and config.parallel.tensor == 1:
        raise ConfigError(
            "parallel.partition_config is set but parallel.tensor = 1: it says how "
            "tensor-parallel ranks split the layers (set parallel.tensor)"
        )
    return Layout(tensor, sequence, world_size // (tensor * sequence))


def kv_heads(hf_config) -> int | None:
    text = hf_config.get_text_config()
    return getattr(text, "num_key_value_heads", None) or getattr(text, "num_attention_heads", None)


def split_source(config: Config | None, hf_config) -> str | None:
    """How AutoTP will split the model's layers: "partition_config", "tp_plan", "preset",
    or None when it has no way (DeepSpeed's precedence, module docstring). ``config``
    None: not counting a partition_config."""
    if config is not None and config.parallel.partition_config is not None:
        return "partition_config"
    if getattr(hf_config.get_text_config(), "base_model_tp_plan", None) or getattr(
        hf_config, "base_model_tp_plan", None
    ):
        return "tp_plan"
    if hf_config.model_type in AUTOTP_PRESETS:
        return "preset"
    return None


def check_model_layout(config: Config, hf_config) -> list[str]:
    """The layout's checks against the model's config.json: a refusal (ConfigError), or
    warnings to print (one line each)."""
    tensor = tensor_degree(config)
    if tensor == 1:
        return []
    if split_source(config, hf_config) is None:
        raise ConfigError(
            f"parallel.tensor = {tensor}: model.hf = {config.model.hf!r} ({hf_config.model_type}) "
            "has no tp_plan in transformers and no DeepSpeed AutoTP preset "
            f"({', '.join(AUTOTP_PRESETS)}): say which layers split in parallel.partition_config "
            "(DeepSpeed's tensor_parallel.partition_config: layer_specs of patterns and "
            '"column" or "row")'
        )
    heads = kv_heads(hf_config)
    if heads is not None and heads % tensor:
        idle = (
            f"{tensor - heads} of {tensor} ranks hold no attention head"
            if heads < tensor
            else (f"the {heads} key/value heads split unevenly over {tensor} ranks")
        )
        return [
            f"warning: parallel.tensor = {tensor} does not divide model.hf's {heads} key/value "
            f"heads: {idle}, so attention does not speed up past that; use a divisor of {heads}"
        ]
    return []
