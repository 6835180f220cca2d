"""What the launcher checks of a Hugging Face model's files before any rank starts: each
a one-line ConfigError (exit 2) instead of a traceback on every rank a minute later."""

from __future__ import annotations

from pathlib import Path

from training.hf.model import auto_class, head_classes, load_hf_config, load_tokenizer
from training.spec.config import Config, ConfigError
from training.spec.parallel import check_model_layout

# config.json's names for the longest sequence a model was built for, by architecture.
POSITION_LIMITS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")
WEIGHT_FILES = ("*.safetensors", "pytorch_model*.bin")


def max_positions(hf_config) -> int | None:
    text = hf_config.get_text_config()
    for name in POSITION_LIMITS:
        value = getattr(text, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def check_model(config: Config, folder: Path) -> None:
    """The model in `folder` can train this job: its code may run, its tokenizer fits its
    embeddings, data.seq_len fits its positions, it has the task's head and weights."""
    model = config.model
    hf_config = load_hf_config(config, folder)
    auto = auto_class(model.task)
    remote = model.trust_remote_code and auto.__name__ in getattr(hf_config, "auto_map", {})
    if not remote and type(hf_config) not in head_classes(model.task):
        raise ConfigError(
            f"model.hf = {model.hf!r} is a {hf_config.model_type} model, which has no "
            f"{model.task} head in transformers ({auto.__name__}): choose another model.task "
            "or model"
        )
    for warning in check_model_layout(config, hf_config):
        print(warning, flush=True)
    text = hf_config.get_text_config()
    tokenizer = load_tokenizer(config, folder)
    if len(tokenizer) > text.vocab_size:
        raise ConfigError(
            f"model.hf = {model.hf!r}: its tokenizer has {len(tokenizer):,} tokens but the "
            f"model's embeddings hold {text.vocab_size:,} (config.json vocab_size): use the "
            "tokenizer that was trained with the model, or resize its embeddings first"
        )
    limit = max_positions(hf_config)
    if limit is not None and config.data.seq_len > limit:
        raise ConfigError(
            f"data.seq_len = {config.data.seq_len} is past model.hf = {model.hf!r}'s maximum "
            f"of {limit} positions (config.json): use data.seq_len <= {limit}"
        )
    # Token files and synthetic tokens carry ids of their own.
    ids_of_their_own = not config.is_text and config.data.builder is None
    if ids_of_their_own and config.vocab_size > text.vocab_size:
        raise ConfigError(
            f"data.vocab_size = {config.vocab_size} is past model.hf = {model.hf!r}'s "
            f"{text.vocab_size:,} embeddings: set data.vocab_size to at most that"
        )
    if config.data.messages_field and not tokenizer.chat_template:
        raise ConfigError(
            f"data.messages_field is set but model.hf = {model.hf!r}'s tokenizer has no chat "
            "template (tokenizer_config.json or chat_template.jinja): use a chat model's "
            "tokenizer, or data.text_field"
        )
    if model.task == "masked-lm" and tokenizer.mask_token_id is None:
        raise ConfigError(
            f"model.task = 'masked-lm' but model.hf = {model.hf!r}'s tokenizer has no mask "
            "token: a masked LM needs one (BERT's [MASK])"
        )
    if model.init == "pretrained" and not any(
        any(folder.glob(pattern)) for pattern in WEIGHT_FILES
    ):
        raise ConfigError(
            f"model.hf = {model.hf!r} has no weights (*.safetensors, pytorch_model*.bin): "
            "set model.init = 'config' to train the architecture from scratch"
        )
