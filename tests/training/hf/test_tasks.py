"""The other tasks of a Hugging Face model: a classifier on labelled documents, and a
masked LM on packed windows (a tiny BERT); a model without the task's head is refused."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import default_collate

from tests.training.tiny_hf import write_jsonl
from training.hf.checks import check_model
from training.hf.model import build
from training.spec.config import ConfigError, load_config
from training.text.packing import Split, samples
from training.text.prepare import prepare

SEQ = 16


def job(tmp_path, model, data, *lines: str):
    toml = tmp_path / "job.toml"
    toml.write_text(
        "\n".join(
            [
                "[model]",
                f'hf = "{model}"',
                *[line for line in lines if line.startswith(("task", "num_labels"))],
                "[data]",
                'kind = "jsonl"',
                f'path = "{data}"',
                f"seq_len = {SEQ}",
                *[line for line in lines if not line.startswith(("task", "num_labels"))],
            ]
        )
        + "\n"
    )
    return load_config(toml)


def first_batch(config, model, tmp_path, size: int = 4):
    folder = prepare(config, model_folder=model, cache_dir=tmp_path, s3_uri=None)
    dataset = samples(Split(folder, "train"), config)
    return dataset, default_collate([dataset[i] for i in range(size)])


def test_a_classifier_trains_on_labelled_documents(tmp_path, tiny_hf):
    records = [{"text": text, "label": i % 3} for i, text in enumerate(tiny_hf.texts[:12])]
    data = write_jsonl(tmp_path / "labelled.jsonl", records)
    config = job(
        tmp_path, tiny_hf.model, data, 'task = "sequence-classification"', "num_labels = 3"
    )
    check_model(config, tiny_hf.model)
    dataset, (ids, labels, mask) = first_batch(config, tiny_hf.model, tmp_path)
    assert len(dataset) == 12 and labels.tolist() == [0, 1, 2, 0]
    assert ids.shape == (4, SEQ) and mask[:, 0].all()
    task = build(config, tiny_hf.model, None, on_gpu=False)
    loss = task(ids, labels, mask)
    loss.backward()
    assert torch.isfinite(loss) and task.model.score.weight.grad.abs().sum() > 0
    assert task.score(ids, labels, mask)[2] == 4  # four predictions: one per document


def test_a_model_without_the_tasks_head_is_refused(tmp_path, tiny_hf):
    config = job(tmp_path, tiny_hf.model, tiny_hf.corpus, 'task = "masked-lm"')
    with pytest.raises(ConfigError, match="has no masked-lm head"):
        check_model(config, tiny_hf.model)


def test_a_masked_lm_predicts_the_hidden_tokens_only(tmp_path, tiny_hf):
    from transformers import AutoTokenizer, BertConfig, BertForMaskedLM

    tokenizer = AutoTokenizer.from_pretrained(tiny_hf.model)
    bert = tmp_path / "bert"
    shape = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2}
    config = BertConfig(vocab_size=len(tokenizer), intermediate_size=64, **shape)
    BertForMaskedLM(config).save_pretrained(bert)
    tokenizer.save_pretrained(bert)
    job_config = job(tmp_path, bert, tiny_hf.corpus, 'task = "masked-lm"', "mask_prob = 0.3")
    check_model(job_config, bert)
    _, (inputs, targets, positions) = first_batch(job_config, bert, tmp_path)
    hidden = targets != -100
    assert hidden.any(dim=1).all()  # every window hides at least one token
    assert (inputs[hidden] == tokenizer.mask_token_id).all()
    assert (inputs[~hidden] != tokenizer.mask_token_id).all()
    loss = build(job_config, bert, None, on_gpu=False)(inputs, targets, positions)
    assert torch.isfinite(loss)
