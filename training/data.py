"""Datasets the trainer reads. Each item is `(inputs, targets)`: LongTensors of seq_len,
targets being inputs shifted by one token.

- `SyntheticSequences`: seeded, learnable sequences (no files needed; loss falls).
- `TokenWindows`: non-overlapping windows over a memory-mapped token array, used both for
  nanoGPT-style `.bin` token files and for raw text read as bytes (vocab 256).
- `MaskedTokens`: any of these turned into a masked-token task for encoders (BERT-style).

`worker_processes` is how every DataLoader of the trainer starts its workers.
"""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from training.watchdog import install_loader_stack_dump

MAX_AUTO_WORKERS = 10
# What this process's fork server imports before its first fork (worker_processes): the
# worker's stack dump, and each dataset's module as loaders are made. One server per process,
# started by the first loader that iterates; a module added after that is imported by workers.
_FORK_SERVER_IMPORTS = {install_loader_stack_dump.__module__}


def data_workers(num_workers: int | str, ranks_per_node: int, cpus: int | None = None) -> int:
    """data.num_workers as a count: "auto" shares this machine's CPUs among its ranks, one
    kept for each rank's own work, at most 10 (2 ranks on 2 cores: none; 1 rank on 8 vCPUs: 7)."""
    if num_workers != "auto":
        return int(num_workers)
    cpus = cpus if cpus is not None else len(os.sched_getaffinity(0))
    return max(0, min(MAX_AUTO_WORKERS, cpus // max(1, ranks_per_node) - 1))


def worker_processes(num_workers: int, dataset: Dataset) -> dict:
    """DataLoader arguments: `num_workers` workers started by a fork server, each of which
    shows its Python stack when the hang watchdog asks (training/watchdog.py).

    A plain fork copies every lock another thread holds at that moment (the stop flag's and
    spot poller's threads, gloo's, boto3's), and a child that takes one waits forever
    (https://docs.python.org/3/library/os.html#os.fork, "forking a multi-threaded process").
    The fork server is a fresh single-threaded process; datasets reach it pickled.

    The server imports `dataset`'s module (and with it torch) once, before its first fork
    (multiprocessing.set_forkserver_preload): every worker, started anew at each epoch and
    each evaluation, is then forked with them loaded instead of importing torch itself,
    seconds of CPU per worker. Measured on 2 cores: the image job's 8 steps with 2 workers
    per rank took 21 s, against 6 s without workers.
    """
    if num_workers == 0:  # DataLoader refuses a context without workers
        return {"num_workers": 0}
    _FORK_SERVER_IMPORTS.add(type(dataset).__module__)
    multiprocessing.set_forkserver_preload(sorted(_FORK_SERVER_IMPORTS))
    return {
        "num_workers": num_workers,
        "multiprocessing_context": "forkserver",
        "worker_init_fn": install_loader_stack_dump,
    }


class SyntheticSequences(Dataset):
    """Arithmetic sequences modulo the vocabulary: token[t] = (start + stride * t) % vocab.

    Start and stride are drawn per item from a generator seeded by (seed, index), so item i
    is the same on every rank and every run. A model can learn the rule, so loss falls.
    """

    def __init__(self, *, vocab_size: int, seq_len: int, num_samples: int, seed: int):
        self.vocab_size, self.seq_len, self.num_samples, self.seed = (
            vocab_size,
            seq_len,
            num_samples,
            seed,
        )

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        generator = np.random.default_rng((self.seed, index))
        start = int(generator.integers(self.vocab_size))
        stride = int(generator.integers(1, 8))
        tokens = (start + stride * torch.arange(self.seq_len + 1)) % self.vocab_size
        return tokens[:-1], tokens[1:]


class TokenWindows(Dataset):
    """Window i covers tokens [i*seq_len, (i+1)*seq_len + 1) of a 1-D token array."""

    def __init__(self, tokens: np.ndarray, *, seq_len: int, vocab_size: int, source: Path):
        if len(tokens) < seq_len + 1:
            raise ValueError(
                f"data.path {source} holds {len(tokens)} tokens, fewer than data.seq_len + 1 = "
                f"{seq_len + 1}: use a bigger file or a smaller seq_len"
            )
        self.tokens, self.seq_len, self.vocab_size = tokens, seq_len, vocab_size

    def __len__(self) -> int:
        return (len(self.tokens) - 1) // self.seq_len

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= index < len(self):
            raise IndexError(f"window {index} is outside 0..{len(self) - 1}")
        start = index * self.seq_len
        window = torch.from_numpy(self.tokens[start : start + self.seq_len + 1].astype(np.int64))
        if window.max() >= self.vocab_size:  # the launcher's check reads a sample only
            raise ValueError(
                f"token id {int(window.max())} at window {index} is not below the vocabulary "
                f"size {self.vocab_size}: set data.vocab_size to the tokenizer's size"
            )
        return window[:-1], window[1:]


# Tokens read by the launcher's check of the largest id: a few MB, whatever the file's size.
_SAMPLE_TOKENS = 1 << 20
_SAMPLE_RUNS = 256


def sampled_max_token(file: Path, dtype: str) -> int | None:
    """The largest token id in an evenly spread sample of a token file (None when empty).

    Runs of consecutive tokens from evenly spaced offsets, the first and last ones
    included: a file from a tokenizer with a larger vocabulary shows its ids anywhere.
    """
    tokens = np.memmap(file, dtype=dtype, mode="r") if file.stat().st_size else np.array([])
    if len(tokens) == 0:
        return None
    run = max(1, _SAMPLE_TOKENS // _SAMPLE_RUNS)
    starts = np.linspace(0, max(0, len(tokens) - run), num=_SAMPLE_RUNS, dtype=np.int64)
    return int(max(tokens[start : start + run].max() for start in np.unique(starts)))


def token_file(path: Path, *, dtype: str, seq_len: int, vocab_size: int) -> TokenWindows:
    """A nanoGPT-style token file (flat uint16/uint32 array); a directory means its train.bin."""
    file = path / "train.bin" if path.is_dir() else path
    if not file.is_file():
        raise ValueError(f"data.path {file} does not exist: point it at a token .bin file")
    tokens = np.memmap(file, dtype=dtype, mode="r")
    return TokenWindows(tokens, seq_len=seq_len, vocab_size=vocab_size, source=file)


def text_bytes(path: Path, *, seq_len: int) -> TokenWindows:
    """Raw text as byte tokens (vocab 256); a directory means its *.txt files, concatenated."""
    if path.is_dir():
        files = sorted(path.glob("*.txt"))
        if not files:
            raise ValueError(f"data.path {path} has no *.txt files: add some or point at a file")
        tokens = np.frombuffer(b"".join(f.read_bytes() for f in files), dtype=np.uint8)
    elif path.is_file():
        tokens = np.memmap(path, dtype=np.uint8, mode="r")
    else:
        raise ValueError(f"data.path {path} does not exist: point it at a text file or directory")
    return TokenWindows(tokens, seq_len=seq_len, vocab_size=256, source=path)


class MaskedTokens(Dataset):
    """BERT's objective over another token dataset: hide some tokens, predict them.

    Of each item's inputs, `mask_prob` of the positions (at least one), drawn from a
    generator seeded by (seed, index), are replaced by `mask_id`; targets hold the hidden
    tokens there and -100 (ignored by the loss) everywhere else.
    """

    def __init__(self, base: Dataset, *, mask_id: int, mask_prob: float, seed: int):
        self.base, self.mask_id, self.mask_prob, self.seed = base, mask_id, mask_prob, seed

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        tokens, _ = self.base[index]
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        masked = torch.rand(tokens.shape, generator=generator) < self.mask_prob
        masked[torch.randint(len(tokens), (), generator=generator)] = True
        inputs = torch.where(masked, self.mask_id, tokens)
        targets = torch.where(masked, tokens, -100)
        return inputs, targets
