"""Tokenized documents on disk, and the training samples cut from them.

One split of the prepared data (training/text/prepare.py) is four flat files:

    <split>.tokens    every document's token ids, one after the other (uint16 or uint32)
    <split>.starts    int64: where each document starts, then the total (documents + 1)
    <split>.trained   uint8 per token, 1 where it is a training target (chat data only)
    <split>.labels    int64 per document (sequence classification only)

Language models train on packed windows: window i is tokens [i*L, (i+1)*L] (L =
data.seq_len, one more for the last target), whatever documents it crosses. Document
boundaries are kept: positions restart at each document (and at the window's start),
which transformers reads as one causal block per document, and no target asks for the
first token of the next document. A window is a function of its index alone, so the
trainer's sampler restores the exact order after a resume.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from training.hf.model import IGNORE_INDEX

MANIFEST = "manifest.json"  # written last: its presence means the folder is complete


def token_dtype(vocabulary: int) -> np.dtype:
    return np.dtype(np.uint16 if vocabulary <= 2**16 else np.uint32)


class Split:
    """One split of prepared data, memory-mapped."""

    def __init__(self, folder: Path, name: str):
        manifest = json.loads((folder / MANIFEST).read_text())
        self.name, self.info = name, manifest["splits"][name]
        self.tokens = np.memmap(folder / f"{name}.tokens", dtype=manifest["dtype"], mode="r")
        self.starts = np.fromfile(folder / f"{name}.starts", dtype=np.int64)
        trained, labels = folder / f"{name}.trained", folder / f"{name}.labels"
        self.trained = np.memmap(trained, dtype=np.uint8, mode="r") if trained.exists() else None
        self.labels = np.fromfile(labels, dtype=np.int64) if labels.exists() else None
        self.special_ids = manifest["special_ids"]
        self.mask_id, self.pad_id = manifest["mask_id"], manifest["pad_id"]

    @property
    def documents(self) -> int:
        return len(self.starts) - 1


def positions_and_boundaries(starts: np.ndarray, begin: int, length: int):
    """(positions restarting at each document and at `begin`, offsets in the window where a
    document starts) for tokens [begin, begin + length]."""
    first = np.searchsorted(starts, begin, side="right")
    last = np.searchsorted(starts, begin + length, side="right")
    inner = starts[first:last] - begin  # 1..length
    marks = np.zeros(length, dtype=np.int64)
    restarts = inner[inner < length]
    marks[restarts] = restarts
    return np.arange(length, dtype=np.int64) - np.maximum.accumulate(marks), inner


def causal_window(
    tokens: np.ndarray, starts: np.ndarray, trained: np.ndarray | None, begin: int, length: int
):
    """(inputs, targets, positions) of tokens [begin, begin + length]: targets are the
    next tokens, IGNORE_INDEX where the next token opens a document or is not trained."""
    chunk = np.asarray(tokens[begin : begin + length + 1], dtype=np.int64)
    positions, inner = positions_and_boundaries(starts, begin, length)
    targets = chunk[1:].copy()
    targets[inner - 1] = IGNORE_INDEX
    if trained is not None:
        targets[np.asarray(trained[begin + 1 : begin + length + 1]) == 0] = IGNORE_INDEX
    return chunk[:-1], targets, positions


class CausalWindows(Dataset):
    """Packed next-token windows of a split."""

    def __init__(self, split: Split, seq_len: int):
        self.split, self.seq_len = split, seq_len

    def __len__(self) -> int:
        return (len(self.split.tokens) - 1) // self.seq_len

    def __getitem__(self, index: int):
        if not 0 <= index < len(self):
            raise IndexError(f"window {index} is outside 0..{len(self) - 1}")
        split = self.split
        window = causal_window(
            split.tokens, split.starts, split.trained, index * self.seq_len, self.seq_len
        )
        return tuple(torch.from_numpy(part) for part in window)


class MaskedWindows(Dataset):
    """Packed windows for a masked LM: `mask_prob` of each window's ordinary tokens (at
    least one), drawn from a generator seeded by (seed, index), read as the mask token;
    targets hold the hidden tokens there and IGNORE_INDEX elsewhere."""

    def __init__(self, split: Split, seq_len: int, *, mask_prob: float, seed: int):
        self.split, self.seq_len, self.mask_prob, self.seed = split, seq_len, mask_prob, seed
        self.special = np.asarray(split.special_ids, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.split.tokens) // self.seq_len

    def __getitem__(self, index: int):
        if not 0 <= index < len(self):
            raise IndexError(f"window {index} is outside 0..{len(self) - 1}")
        begin = index * self.seq_len
        tokens = np.asarray(self.split.tokens[begin : begin + self.seq_len], dtype=np.int64)
        positions, _ = positions_and_boundaries(self.split.starts, begin, self.seq_len)
        generator = np.random.default_rng((self.seed, index))
        ordinary = np.flatnonzero(~np.isin(tokens, self.special))
        masked = np.zeros(len(tokens), dtype=bool)
        if len(ordinary):
            masked[ordinary[generator.random(len(ordinary)) < self.mask_prob]] = True
            masked[ordinary[generator.integers(len(ordinary))]] = True
        inputs = np.where(masked, self.split.mask_id, tokens)
        targets = np.where(masked, tokens, IGNORE_INDEX)
        return torch.from_numpy(inputs), torch.from_numpy(targets), torch.from_numpy(positions)


class LabelledDocuments(Dataset):
    """One document per sample, padded to seq_len: (ids, class, attention mask)."""

    def __init__(self, split: Split, seq_len: int):
        self.split, self.seq_len = split, seq_len

    def __len__(self) -> int:
        return self.split.documents

    def __getitem__(self, index: int):
        begin, end = self.split.starts[index], self.split.starts[index + 1]
        ids = np.full(self.seq_len, self.split.pad_id, dtype=np.int64)
        length = min(end - begin, self.seq_len)
        ids[:length] = self.split.tokens[begin : begin + length]
        mask = np.zeros(self.seq_len, dtype=np.int64)
        mask[:length] = 1
        label = torch.tensor(int(self.split.labels[index]))
        return torch.from_numpy(ids), label, torch.from_numpy(mask)


def samples(split: Split, config) -> Dataset:
    """The task's samples of a prepared split."""
    task, seq_len = config.model.task, config.data.seq_len
    if task == "sequence-classification":
        return LabelledDocuments(split, seq_len)
    if task == "masked-lm":
        return MaskedWindows(split, seq_len, mask_prob=config.data.mask_prob, seed=config.run.seed)
    return CausalWindows(split, seq_len)
