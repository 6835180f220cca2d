"""A tiny Hugging Face model for tests, made here: nothing is downloaded.

A byte-level BPE tokenizer trained (tokenizers) on the tests' own text, with a chat
template; a 2-layer Llama (hidden 64) of that vocabulary from a LlamaConfig, saved with
its tokenizer as `from_pretrained` reads a model folder.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "a",
    "lazy",
    "dog",
    "while",
    "the",
    "cat",
    "sleeps",
    "near",
    "an",
    "old",
    "red",
    "barn",
    "and",
    "birds",
    "sing",
    "in",
    "tall",
    "green",
    "trees",
    "by",
    "the",
    "river",
]
# A ChatML-like template: each turn is <|role|>content</s>; the generation prompt opens
# the assistant's turn.
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
LAYERS, HIDDEN, HEADS, KV_HEADS, INTERMEDIATE, POSITIONS = 2, 64, 4, 2, 128, 128


def sentences(count: int, seed: int = 0) -> list[str]:
    """`count` documents of 5 to 40 words drawn from WORDS: repetitive, so loss falls."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 40))) for _ in range(count)]


def train_tokenizer(texts: list[str], vocab_size: int = 300):
    """A fast tokenizer trained on `texts`: <s> opens each encoding, </s> ends a document."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    special = ["<unk>", "<s>", "</s>", "<pad>", "<mask>", "<|user|>", "<|assistant|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(texts, trainer)
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", tokenizer.token_to_id("<s>"))]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        mask_token="<mask>",
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def llama_config(tokenizer, **changes):
    from transformers import LlamaConfig

    shape = {
        "vocab_size": len(tokenizer),
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "max_position_embeddings": POSITIONS,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
        "tie_word_embeddings": False,
    }
    return LlamaConfig(**(shape | changes))


def save_model(folder: Path, tokenizer, *, seed: int = 0, **changes) -> Path:
    """A randomly initialised tiny Llama and its tokenizer, saved in `folder`."""
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    LlamaForCausalLM(llama_config(tokenizer, **changes)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return path


# Tensors per layer: q, k, v, o, gate, up, down and two RMSNorms; besides the layers, the
# token table, the final RMSNorm and the output layer.
TENSORS_PER_LAYER, OTHER_TENSORS = 9, 3


def llama_parameters(vocab: int, layers: int = LAYERS) -> int:
    """The tiny Llama's parameter count, from its shape: per layer q and o (h²), k and v
    (h x kv heads x head width), gate, up and down (3 x h x intermediate), two RMSNorms;
    the token table, the output layer (untied) and the final RMSNorm."""
    kv = KV_HEADS * HIDDEN // HEADS
    layer = 2 * HIDDEN * HIDDEN + 2 * HIDDEN * kv + 3 * HIDDEN * INTERMEDIATE + 2 * HIDDEN
    return layers * layer + 2 * vocab * HIDDEN + HIDDEN
