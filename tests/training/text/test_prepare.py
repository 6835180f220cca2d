"""`prepare`: records become the model's own tokens, chat turns trained on the assistant's
only, and a record without the text names the fields it has."""

from __future__ import annotations

import numpy as np
import pytest
from transformers import AutoTokenizer

from tests.training.tiny_hf import write_jsonl
from training.spec.config import ConfigError, load_config
from training.text.packing import CausalWindows, Split
from training.text.prepare import prepare

IGNORE = -100
SEQ = 16
CHATS = [
    [
        {"role": "user", "content": "the fox"},
        {"role": "assistant", "content": "jumps over the dog"},
        {"role": "user", "content": "and the cat"},
        {"role": "assistant", "content": "sleeps"},
    ],
    [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "where are the birds"},
        {"role": "assistant", "content": "in tall green trees"},
    ],
]


def config_for(tmp_path, tiny_hf, *overrides: str):
    toml = tmp_path / "job.toml"
    toml.write_text(
        f'[model]\nhf = "{tiny_hf.model}"\n'
        f'[data]\nkind = "jsonl"\npath = "{tiny_hf.corpus}"\nseq_len = {SEQ}\n'
    )
    return load_config(toml, list(overrides))


def prepared(tmp_path, tiny_hf, *overrides: str) -> Split:
    config = config_for(tmp_path, tiny_hf, *overrides)
    folder = prepare(config, model_folder=tiny_hf.model, cache_dir=tmp_path, s3_uri=None)
    return Split(folder, "train")


def test_chat_data_trains_on_the_assistant_turns_only(tmp_path, tiny_hf):
    data = write_jsonl(tmp_path / "chats.jsonl", [{"messages": chat} for chat in CHATS])
    split = prepared(tmp_path, tiny_hf, f"data.path={data}", "data.messages_field=messages")
    tokens = np.asarray(split.tokens, dtype=np.int64)
    trained = np.asarray(split.trained, dtype=bool)
    tokenizer = AutoTokenizer.from_pretrained(tiny_hf.model)
    # The template writes each turn as <|role|>content</s>, and opens the assistant's turn
    # with <|assistant|>: what is trained is each reply and the end of its turn.
    replies = "".join(m["content"] + "</s>" for c in CHATS for m in c if m["role"] == "assistant")
    context = "".join(
        f"<|{m['role']}|>" + ("" if m["role"] == "assistant" else m["content"] + "</s>")
        for chat in CHATS
        for m in chat
    )
    assert tokenizer.decode(tokens[trained]) == replies
    assert tokenizer.decode(tokens[~trained]) == context
    # The packed windows ask for exactly the trained tokens: window i's target j is token
    # i * SEQ + j + 1 where that one is trained, and ignored where it is not.
    windows = CausalWindows(split, seq_len=SEQ)
    assert len(windows) > 1
    for index in range(len(windows)):
        _, targets, _ = windows[index]
        following = np.arange(index * SEQ + 1, (index + 1) * SEQ + 1)
        expected = np.where(trained[following], tokens[following], IGNORE)
        assert targets.tolist() == expected.tolist()


def test_text_documents_are_the_tokenizers_encoding_ended_by_eos(tmp_path, tiny_hf):
    split = prepared(tmp_path, tiny_hf)
    tokenizer = AutoTokenizer.from_pretrained(tiny_hf.model)
    assert split.documents == len(tiny_hf.texts)
    assert split.trained is None  # every token of plain text is trained
    for index in (0, 1, len(tiny_hf.texts) - 1):
        text = tiny_hf.texts[index]
        words = tokenizer.encode(text, add_special_tokens=False)
        expected = [tokenizer.bos_token_id, *words, tokenizer.eos_token_id]
        begin, end = split.starts[index], split.starts[index + 1]
        assert split.tokens[begin:end].tolist() == expected
        assert tokenizer.decode(words) == text


def test_a_record_without_the_text_field_names_the_fields_it_has(tmp_path, tiny_hf):
    data = write_jsonl(tmp_path / "notes.jsonl", [{"id": 1, "body": "the fox"}])
    with pytest.raises(ConfigError) as raised:
        prepared(tmp_path, tiny_hf, f"data.path={data}")
    message = str(raised.value)
    assert "has no field 'text' (data.text_field)" in message
    assert "its records have 'id', 'body'" in message
    assert not list((tmp_path / "tokens").iterdir())  # nothing half-written stays


@pytest.mark.multiprocess
@pytest.mark.slow(reason="a tokenizing process per core, each importing transformers", seconds=50)
def test_many_chats_are_tokenized_on_every_core_in_their_order(tmp_path, tiny_hf, monkeypatch):
    """Past one batch of chats, a tokenizing process per core: the documents still come
    out in the records' order, each as the template renders it."""
    from training.text import prepare as preparing

    monkeypatch.setattr(preparing, "BATCH", 4)  # 10 chats: 3 batches, processes' path
    chats = [
        [{"role": "user", "content": f"chat {i}"}, {"role": "assistant", "content": text}]
        for i, text in enumerate(tiny_hf.texts[:10])
    ]
    data = write_jsonl(tmp_path / "chats.jsonl", [{"messages": chat} for chat in chats])
    split = prepared(tmp_path, tiny_hf, f"data.path={data}", "data.messages_field=messages")
    tokenizer = AutoTokenizer.from_pretrained(tiny_hf.model)
    assert split.documents == len(chats)
    for index, chat in enumerate(chats):
        begin, end = split.starts[index], split.starts[index + 1]
        assert tokenizer.decode(split.tokens[begin:end]) == tokenizer.apply_chat_template(
            chat, tokenize=False
        )
