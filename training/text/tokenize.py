"""Records to documents: token ids from the model's own tokenizer, which of them are trained,
and a classifier's label.

- Text (`data.text_field`): the tokenizer's encoding with its special tokens (a BOS, or
  BERT's [CLS] ... [SEP]); a causal LM's document ends with the EOS token, so the model
  learns where text stops.
- Chat (`data.messages_field`, a list of {"role", "content"}): the tokenizer's chat
  template renders the conversation; only the assistant's turns (their text and the
  template's end-of-turn after it) are trained. Each assistant turn is located by
  rendering the conversation up to it with the generation prompt, and up to its end:
  the characters between the two are the turn, and a token is trained when it starts
  among them (the fast tokenizer's offsets). A template that does not render a shorter
  conversation as the beginning of a longer one is refused: its turns cannot be located.
- Classification (`data.label_field`): the text cut to data.seq_len tokens, and its class.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from training.spec.config import Config, ConfigError


@dataclass(frozen=True)
class Settings:
    """What the encoding depends on besides the tokenizer (part of the cache key)."""

    task: str
    text_field: str
    messages_field: str | None
    label_field: str | None
    num_labels: int | None
    seq_len: int

    @classmethod
    def of(cls, config: Config) -> Settings:
        data, model = config.data, config.model
        classifying = model.task == "sequence-classification"
        return cls(
            task=model.task,
            text_field="text" if data.kind == "text-files" else data.text_field,
            messages_field=data.messages_field,
            label_field=data.label_field if classifying else None,
            num_labels=model.num_labels,
            # Only a classifier's documents are cut; packed windows use seq_len later.
            seq_len=data.seq_len if classifying else 0,
        )

    @property
    def fields(self) -> list[str]:
        """The fields each record must have."""
        main = self.messages_field or self.text_field
        return [main, self.label_field] if self.label_field else [main]


@dataclass
class Document:
    ids: np.ndarray  # int64 token ids
    trained: np.ndarray | None = None  # bool per token: predicted in training (chat); None: all
    label: int | None = None


class Encoder:
    """Turns batches of records into documents with one tokenizer."""

    def __init__(self, tokenizer, settings: Settings):
        self.tokenizer, self.settings = tokenizer, settings
        eos = tokenizer.eos_token_id
        self.eos = eos if settings.task == "causal-lm" and not settings.messages_field else None

    @classmethod
    def from_folder(cls, folder: Path, settings: Settings, trust_remote_code: bool) -> Encoder:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=trust_remote_code)
        return cls(tokenizer, settings)

    def check_fields(self, record: dict, where: str) -> None:
        check_fields(self.settings, record, where)

    def __call__(self, records: list[dict]) -> list[Document]:
        settings = self.settings
        if settings.messages_field:
            return [self.chat(record[settings.messages_field]) for record in records]
        texts = [record[settings.text_field] for record in records]
        for text in texts:
            if not isinstance(text, str):
                raise ValueError(
                    f"data.text_field {settings.text_field!r} holds {type(text).__name__} "
                    f"{str(text)[:80]!r}, not text"
                )
        if settings.label_field:
            encoded = self.tokenizer(texts, truncation=True, max_length=settings.seq_len)
            labels = [self._label(record[settings.label_field]) for record in records]
            return [
                Document(np.asarray(ids, dtype=np.int64), label=label)
                for ids, label in zip(encoded["input_ids"], labels, strict=True)
            ]
        documents = []
        for ids in self.tokenizer(texts)["input_ids"]:
            if self.eos is not None and (not ids or ids[-1] != self.eos):
                ids = [*ids, self.eos]
            documents.append(Document(np.asarray(ids, dtype=np.int64)))
        return documents

    def _label(self, value) -> int:
        if isinstance(value, bool) or not isinstance(value, int | np.integer):
            raise ValueError(f"data.label_field holds {value!r}, not an integer class")
        if not 0 <= value < self.settings.num_labels:
            raise ValueError(
                f"data.label_field holds class {value}, outside 0..{self.settings.num_labels - 1}"
                " (model.num_labels)"
            )
        return int(value)

    def render(self, messages: list[dict], *, generation_prompt: bool = False) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=generation_prompt
        )

    def chat(self, messages: list[dict]) -> Document:
        if not isinstance(messages, list) or not all(
            isinstance(m, dict) and "role" in m and "content" in m for m in messages
        ):
            raise ValueError(
                f"data.messages_field holds {str(messages)[:80]!r}: expected a list of "
                '{"role": ..., "content": ...} messages'
            )
        full = self.render(messages)
        spans = []
        for index, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            before = self.render(messages[:index], generation_prompt=True)
            through = self.render(messages[: index + 1])
            if not (through.startswith(before) and full.startswith(through)):
                raise ValueError(
                    "the chat template does not render a conversation as the beginning of a "
                    "longer one, so its assistant turns cannot be located"
                )
            spans.append((len(before), len(through)))
        # The template writes the special tokens itself (apply_chat_template's tokenize=True
        # encodes without adding any).
        encoded = self.tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
        starts = np.asarray([start for start, _ in encoded["offset_mapping"]], dtype=np.int64)
        trained = np.zeros(len(starts), dtype=bool)
        for begin, end in spans:
            trained |= (starts >= begin) & (starts < end)
        return Document(np.asarray(encoded["input_ids"], dtype=np.int64), trained=trained)


def check_fields(settings: Settings, record: dict, where: str) -> None:
    """ConfigError naming the fields a record has when it lacks one it needs."""
    for name in settings.fields:
        if name not in record:
            key = {
                settings.text_field: "data.text_field",
                settings.messages_field: "data.messages_field",
                settings.label_field: "data.label_field",
            }[name]
            raise ConfigError(
                f"{where} has no field {name!r} ({key}); its records have "
                f"{', '.join(repr(field) for field in record) or 'no fields'}: set {key} "
                "to the one that holds it"
            )


# ------------------------------------------------------------------ worker processes

_encoder: Encoder | None = None


def start_worker(folder: Path, settings: Settings, trust_remote_code: bool) -> None:
    """A tokenizing process's initializer: one tokenizer per process, and its own
    parallelism off (the processes are the parallelism)."""
    global _encoder
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _encoder = Encoder.from_folder(folder, settings, trust_remote_code)


def encode_in_worker(records: list[dict]) -> list[Document]:
    return _encoder(records)
