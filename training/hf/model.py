"""A Hugging Face model, built the one way the trainer builds it, behind the trainer's
model interface (`forward(...) -> loss`, `score(...)`, `flops_per_token(seq_len)`).

`build` is the only place a transformers model is constructed for training; what later
shapes its placement (a [parallel] section: tensor or sequence parallelism) hooks in
here. At ZeRO-3 the model is created partitioned: transformers' DeepSpeed integration
(`HfDeepSpeedConfig`, kept alive while the model is built) makes `from_pretrained` and
`from_config` construct it inside `deepspeed.zero.Init`, and `from_pretrained` then
loads the weights into it one module at a time, gathering only that module's parameters
(transformers/modeling_utils.py `_from_config` and `_load_pretrained_model`,
integrations/deepspeed.py `_load_state_dict_into_zero3_model`, v5.24.0). No rank ever
holds the whole model.

Packed windows (training/text/packing.py) restart `position_ids` at each document; with
no attention mask and no key/value cache (use_cache is turned off here), transformers turns
that into a block-diagonal causal mask, so a token never attends to another document
(masking_utils.py `_preprocess_mask_arguments`, `find_packed_sequence_indices`; flash
attention takes the same position ids as variable-length sequences).
"""

from __future__ import annotations

import inspect
import logging
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from training.hf.sequence_parallel import SequenceGroup, register_ulysses
from training.spec.config import Config, ConfigError

log = logging.getLogger(__name__)

IGNORE_INDEX = -100  # targets the loss skips (PyTorch's cross_entropy default)


def auto_class(task: str):
    """The transformers Auto class that builds `task`'s head on any architecture."""
    import transformers

    return {
        "causal-lm": transformers.AutoModelForCausalLM,
        "masked-lm": transformers.AutoModelForMaskedLM,
        "sequence-classification": transformers.AutoModelForSequenceClassification,
    }[task]


def head_classes(task: str):
    """transformers' table of the architectures that have `task`'s head: configuration
    class -> model class (the one `auto_class(task)` picks from)."""
    import transformers

    return {
        "causal-lm": transformers.MODEL_FOR_CAUSAL_LM_MAPPING,
        "masked-lm": transformers.MODEL_FOR_MASKED_LM_MAPPING,
        "sequence-classification": transformers.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING,
    }[task]


def training_dtype(config: Config) -> torch.dtype:
    precision = config.precision
    return torch.bfloat16 if precision.bf16 else torch.float16 if precision.fp16 else torch.float32


def load_hf_config(config: Config, folder: Path):
    """The model's configuration (config.json), with the task's head settings."""
    from transformers import AutoConfig

    options: dict[str, Any] = {}
    if config.model.num_labels is not None:
        options["num_labels"] = config.model.num_labels
    try:
        return AutoConfig.from_pretrained(
            folder, trust_remote_code=config.model.trust_remote_code, **options
        )
    except ValueError as error:
        raise _config_error(config, error) from None


def _config_error(config: Config, error: ValueError) -> Exception:
    import transformers

    text = str(error)
    if "trust_remote_code" in text:
        return ConfigError(
            f"model.hf = {config.model.hf!r} runs Python code of its own (config.json's "
            "auto_map) and model.trust_remote_code is false: read that code, then set "
            "model.trust_remote_code = true"
        )
    if "model type" in text or "model_type" in text:
        return ConfigError(
            f"model.hf = {config.model.hf!r}: transformers {transformers.__version__} does "
            f"not know its architecture ({text.splitlines()[0]})"
        )
    return error


def load_tokenizer(config: Config, folder: Path):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(
            folder, trust_remote_code=config.model.trust_remote_code
        )
    except ValueError as error:
        raise _config_error(config, error) from None
    except OSError as error:
        raise ConfigError(
            f"model.hf = {config.model.hf!r} has no tokenizer transformers can load "
            f"({str(error).splitlines()[0]}): the model's folder needs its tokenizer files"
        ) from None


def attention_implementation(config: Config, hf_config, *, on_gpu: bool) -> tuple[str, str]:
    """(implementation, why): FlashAttention where it is installed, the GPU runs the
    training in 16 bits and the architecture supports it; PyTorch's SDPA otherwise."""
    if not on_gpu:
        return "sdpa", "no GPU"
    if training_dtype(config) == torch.float32:
        return "sdpa", "FlashAttention needs bf16 or fp16"
    from transformers.utils import is_flash_attn_2_available, is_flash_attn_3_available

    model_class = head_classes(config.model.task).get(type(hf_config), None)
    if model_class is None or not getattr(model_class, "_supports_flash_attn", False):
        return "sdpa", "the architecture has no FlashAttention path"
    major, _ = torch.cuda.get_device_capability()
    if major == 9 and is_flash_attn_3_available():
        return "flash_attention_3", "installed, Hopper GPU"
    if is_flash_attn_2_available():
        return "flash_attention_2", "installed"
    return "sdpa", "flash-attn is not installed"


def build(
    config: Config, folder: Path, ds_config: dict[str, Any] | None, *, on_gpu: bool
) -> HfTask:
    """The job's model from the local folder `folder` (training/hf/source.py), partitioned
    across the ranks when `ds_config` is ZeRO-3's."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one bar per rank and shard would flood the log
    hf_config = load_hf_config(config, folder)
    attention, why = attention_implementation(config, hf_config, on_gpu=on_gpu)
    log.info("attention: %s (%s)", attention, why)
    zero3 = ds_config is not None and ds_config["zero_optimization"]["stage"] == 3
    # Referenced by the returned module: transformers keeps only a weak reference.
    partitioning = _hf_deepspeed_config(ds_config) if zero3 else None
    options = {
        "dtype": training_dtype(config),
        "attn_implementation": attention,
        "trust_remote_code": config.model.trust_remote_code,
    }
    auto = auto_class(config.model.task)
    if config.model.init == "pretrained":
        model = auto.from_pretrained(folder, config=hf_config, **options)
    else:
        model = auto.from_config(hf_config, **options)
    # Training keeps no key/value cache; with one, packed documents would see each other.
    model.config.use_cache = False
    model.train()  # from_pretrained leaves a model in eval mode, its dropout off
    if config.model.activation_checkpointing:
        model.activation_checkpointing_enable({"use_reentrant": False})
    return HfTask(model, config.model.task, partitioning)


def architecture(config: Config, hf_config, *, attention: str = "sdpa") -> HfTask:
    """The model's modules from its configuration alone (no weights): for `estimate`,
    built on the meta device."""
    model = auto_class(config.model.task).from_config(
        hf_config,
        dtype=training_dtype(config),
        attn_implementation=attention,
        trust_remote_code=config.model.trust_remote_code,
    )
    return HfTask(model, config.model.task, None)


def _hf_deepspeed_config(ds_config: dict[str, Any]):
    from transformers.integrations import HfDeepSpeedConfig

    return HfDeepSpeedConfig(ds_config)


class HfTask(nn.Module):
    """A transformers model as the trainer runs it: the loss of a batch of
    (inputs, targets, positions or attention mask).

    Language models take packed windows: targets are the next tokens (-100 where nothing
    is to be predicted: across a document boundary, a chat's non-assistant turns, an
    unmasked token of a masked-LM), positions restart at each document. A classifier
    takes one padded document per row, its class, and the padding mask.
    """

    def __init__(self, model: nn.Module, task: str, partitioning: Any = None):
        super().__init__()
        self.model = model
        self.task = task
        self._partitioning = partitioning  # HfDeepSpeedConfig at ZeRO-3, kept alive
        accepted = inspect.signature(model.forward).parameters
        self._takes_positions = "position_ids" in accepted
        # DeepSpeed's AutoTP finds the layers to split in the model's config
        # (base_model_tp_plan) and its class's _tp_plan (_get_hf_tp_plan,
        # deepspeed/runtime/tensor_parallel/config.py): both shown through this wrapper.
        self._tp_plan = getattr(type(model), "_tp_plan", None)
        # Counted before tensor parallelism leaves each rank a slice of the weights.
        self._matmul_params = _matmul_params(model)
        # Set by split_sequences: this rank's slice of every sequence (Ulysses).
        self.sequence: SequenceGroup | None = None

    def split_sequences(self, sequence: int, micro_batch: int):
        """Ulysses over `sequence` ranks (training/hf/sequence_parallel.py): returns the
        groups object deepspeed.initialize takes (``mpu``)."""
        if not self._takes_positions:
            raise ConfigError(
                f"parallel.sequence = {sequence}: {type(self.model).__name__}.forward takes no "
                "position_ids, which Ulysses gathers to mask each sequence; use "
                "parallel.sequence = 1"
            )
        attention = self.model.config._attn_implementation
        groups, self.sequence = register_ulysses(self.model, attention, sequence, micro_batch)
        return groups

    @property
    def config(self):
        return self.model.config

    def logits(self, inputs: torch.Tensor, extra: torch.Tensor | None = None) -> torch.Tensor:
        """`extra`: a classifier's attention mask, else positions (None: 0, 1, 2, ...)."""
        if self.task == "sequence-classification":
            return self.model(input_ids=inputs, attention_mask=extra).logits
        if self._takes_positions and extra is not None:
            return self.model(input_ids=inputs, position_ids=extra).logits
        return self.model(input_ids=inputs).logits

    def forward(
        self, inputs: torch.Tensor, targets: torch.Tensor, extra: torch.Tensor | None = None
    ) -> torch.Tensor:
        if self.sequence is not None:
            inputs, targets, extra = self._my_slice(inputs, targets, extra)
            logits = self.logits(inputs, extra).float()
            wanted = targets.reshape(-1)
            summed = F.cross_entropy(
                logits.reshape(-1, logits.shape[-1]),
                wanted,
                ignore_index=IGNORE_INDEX,
                reduction="sum",
            )
            return self.sequence.share_of_loss(summed, (wanted != IGNORE_INDEX).sum())
        logits = self.logits(inputs, extra).float()
        return F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=IGNORE_INDEX
        )

    def _my_slice(self, inputs, targets, positions):
        """This rank's slice of a batch's sequences; positions count from 0 when the data
        has none, since Ulysses gathers them to mask the whole sequence."""
        if positions is None:
            positions = torch.arange(inputs.shape[1], device=inputs.device).expand_as(inputs)
        part = self.sequence
        return part.slice(inputs), part.slice(targets), part.slice(positions)

    def score(
        self, inputs: torch.Tensor, targets: torch.Tensor, extra: torch.Tensor | None = None
    ) -> torch.Tensor:
        """[summed loss, correct top-1 predictions, predictions] over the batch's targets
        (under Ulysses, over this rank's slice of them: the evaluator sums every rank's)."""
        if self.sequence is not None:
            inputs, targets, extra = self._my_slice(inputs, targets, extra)
        logits = self.logits(inputs, extra).float()
        flat, wanted = logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)
        counted = wanted != IGNORE_INDEX
        loss = F.cross_entropy(flat, wanted, ignore_index=IGNORE_INDEX, reduction="sum")
        correct = ((flat.argmax(dim=-1) == wanted) & counted).sum()
        return torch.stack([loss, correct.to(loss.dtype), counted.sum().to(loss.dtype)])

    def flops_per_token(self, seq_len: int) -> int:
        """6N + 12·L·H·Q·T (PaLM appendix B): N without the input embedding table unless
        it is tied to the output layer, whose matmul costs real FLOPs."""
        text = self.model.config.get_text_config()
        heads = text.num_attention_heads
        head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
        attention = 12 * text.num_hidden_layers * heads * head_dim * seq_len
        return 6 * self._matmul_params + attention


def _matmul_params(model: nn.Module) -> int:
    """Parameters in matmuls: all, less the input embedding table unless it is tied to
    the output layer."""
    total = sum(_numel(p) for p in {id(p): p for p in model.parameters()}.values())
    embeddings = model.get_input_embeddings()
    tied = embeddings.weight is getattr(model.get_output_embeddings(), "weight", None)
    return total if tied else total - _numel(embeddings.weight)


def _numel(param: torch.Tensor) -> int:
    return getattr(param, "ds_numel", param.numel())
