"""Packed windows keep document boundaries: positions restart at each document and no
target asks for the first token of the next one (hand-computed windows)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from training.text.packing import MANIFEST, CausalWindows, LabelledDocuments, Split

IGNORE = -100
DOCUMENTS = [[10, 11, 12], [20, 21], [30, 31, 32, 33]]


def write_split(folder, documents, *, trained=None, labels=None, pad_id=0):
    tokens = np.concatenate([np.asarray(d, dtype=np.uint16) for d in documents])
    tokens.tofile(folder / "train.tokens")
    np.cumsum([0] + [len(d) for d in documents]).astype(np.int64).tofile(folder / "train.starts")
    if trained is not None:
        np.asarray(trained, dtype=np.uint8).tofile(folder / "train.trained")
    if labels is not None:
        np.asarray(labels, dtype=np.int64).tofile(folder / "train.labels")
    manifest = {
        "dtype": "uint16",
        "splits": {"train": {"documents": len(documents), "tokens": len(tokens)}},
        "special_ids": [],
        "mask_id": None,
        "pad_id": pad_id,
    }
    (folder / MANIFEST).write_text(json.dumps(manifest))
    return Split(folder, "train")


def as_lists(window):
    return [part.tolist() for part in window]


def test_windows_restart_positions_at_documents_and_never_predict_across_them(tmp_path):
    windows = CausalWindows(write_split(tmp_path, DOCUMENTS), seq_len=4)
    assert len(windows) == 2  # 9 tokens: two windows of 4 and their next tokens
    # Window 0 is tokens 0..4: 10 11 12 | 20 21.
    assert as_lists(windows[0]) == [[10, 11, 12, 20], [11, 12, IGNORE, 21], [0, 1, 2, 0]]
    # Window 1 is tokens 4..8: 21 | 30 31 32 33; it starts inside the second document.
    assert as_lists(windows[1]) == [[21, 30, 31, 32], [IGNORE, 31, 32, 33], [0, 0, 1, 2]]
    with pytest.raises(IndexError):
        windows[2]


def test_untrained_tokens_are_never_targets(tmp_path):
    trained = [0, 1, 1, 0, 0, 0, 0, 1, 1]  # per token: the targets that may be predicted
    windows = CausalWindows(write_split(tmp_path, DOCUMENTS, trained=trained), seq_len=4)
    assert as_lists(windows[0])[1] == [11, 12, IGNORE, IGNORE]
    assert as_lists(windows[1])[1] == [IGNORE, IGNORE, 32, 33]


def test_a_classifier_sees_one_padded_document_and_its_class(tmp_path):
    split = write_split(tmp_path, DOCUMENTS, labels=[2, 0, 1], pad_id=7)
    documents = LabelledDocuments(split, seq_len=3)
    assert len(documents) == 3
    assert as_lists(documents[1]) == [[20, 21, 7], 0, [1, 1, 0]]
    assert as_lists(documents[2]) == [[30, 31, 32], 1, [1, 1, 1]]  # cut at seq_len
