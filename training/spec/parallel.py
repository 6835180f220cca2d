"""The job's layout: ranks that split each layer (tensor), each sequence (sequence), and
the data-parallel ranks left over; and the checks a layout must pass against the model's
config.json before any GPU is rented (`estimate`, the launcher), each a one-line
ConfigError. The checks that need no model files (which `plan` runs too) are
training.spec.config.check_layout.

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
    check_sequence_heads(config.parallel.sequence, hf_config)
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


def check_sequence_heads(sequence: int, hf_config) -> None:
    """Ulysses gives each rank of a sequence group an equal share of the attention heads,
    and of the key/value heads or copies of them (UlyssesSPAttentionHF's checks,
    deepspeed/runtime/sequence_parallel/ulysses_sp.py)."""
    if sequence == 1:
        return
    text = hf_config.get_text_config()
    heads = text.num_attention_heads
    kv = getattr(text, "num_key_value_heads", None) or heads
    if heads % sequence:
        raise ConfigError(
            f"parallel.sequence = {sequence} does not divide model.hf's {heads} attention "
            "heads: each rank of a sequence group computes attention for an equal share of "
            f"them; use a divisor of {heads}"
        )
    if kv % sequence and sequence % kv:
        raise ConfigError(
            f"parallel.sequence = {sequence} and model.hf's {kv} key/value heads: neither "
            "divides the other, so they cannot be shared or copied evenly over the group; use "
            f"a divisor or a multiple of {kv}"
        )
