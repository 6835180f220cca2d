"""Datasets: synthetic sequences, nanoGPT token files (memmap) and raw text as bytes."""

from __future__ import annotations

import subprocess
import sys
import threading

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from tests.training.multirank import REPO_ROOT
from training.components import build_dataset
from training.data import (
    MaskedTokens,
    SyntheticSequences,
    sampled_max_token,
    text_bytes,
    token_file,
    worker_processes,
)
from training.spec.config import load_config


def test_synthetic_items_are_seeded_and_follow_their_rule():
    data = SyntheticSequences(vocab_size=50, seq_len=12, num_samples=100, seed=3)
    inputs, targets = data[7]
    again, _ = SyntheticSequences(vocab_size=50, seq_len=12, num_samples=100, seed=3)[7]
    other, _ = SyntheticSequences(vocab_size=50, seq_len=12, num_samples=100, seed=4)[7]
    assert torch.equal(inputs, again)
    assert not torch.equal(inputs, other)
    assert torch.equal(inputs[1:], targets[:-1])
    stride = (targets - inputs) % 50
    assert (stride == stride[0]).all() and stride[0] != 0
    assert inputs.dtype == torch.int64 and inputs.shape == (12,)


@pytest.mark.parametrize("dtype", ["uint16", "uint32"])
def test_token_file_windows_read_the_memmap(tmp_path, dtype):
    tokens = np.arange(1, 102, dtype=dtype) * 7
    (tmp_path / "train.bin").write_bytes(tokens.tobytes())
    data = token_file(tmp_path, dtype=dtype, seq_len=10, vocab_size=1000)  # a directory
    assert len(data) == 10  # (101 - 1) // 10
    inputs, targets = data[3]
    assert inputs.tolist() == (tokens[30:40].astype(int)).tolist()
    assert targets.tolist() == (tokens[31:41].astype(int)).tolist()
    assert isinstance(data.tokens, np.memmap)


def test_token_file_errors_name_the_path(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        token_file(tmp_path / "nope.bin", dtype="uint16", seq_len=4, vocab_size=10)
    small = tmp_path / "small.bin"
    small.write_bytes(np.arange(3, dtype=np.uint16).tobytes())
    with pytest.raises(ValueError, match=r"fewer than data\.seq_len"):
        token_file(small, dtype="uint16", seq_len=4, vocab_size=10)


def test_text_is_read_as_bytes_from_a_file_or_a_directory(tmp_path):
    (tmp_path / "a.txt").write_text("hello world, ")
    (tmp_path / "b.txt").write_text("héllo again")
    single = text_bytes(tmp_path / "a.txt", seq_len=4)
    inputs, targets = single[1]
    assert bytes(inputs.tolist()) == b"o wo" and bytes(targets.tolist()) == b" wor"
    both = text_bytes(tmp_path, seq_len=4)
    joined = "hello world, héllo again".encode()
    assert len(both) == (len(joined) - 1) // 4
    assert bytes(both[4][0].tolist()) == joined[16:20]
    assert max(max(x.tolist()) for x, _ in both) > 127  # é's UTF-8 bytes, no decoding
    with pytest.raises(IndexError):
        both[len(both)]


def test_config_builds_the_dataset_it_names(tmp_path):
    (tmp_path / "corpus.txt").write_text("abc" * 50)
    config = load_config(None, ["data.kind=text", f"data.path={tmp_path / 'corpus.txt'}"], env={})
    assert config.vocab_size == 256
    data = build_dataset(config)
    assert bytes(data[0][0][:3].tolist()) == b"abc"


def test_masked_tokens_hide_some_tokens_and_ask_for_them():
    base = SyntheticSequences(vocab_size=50, seq_len=200, num_samples=10, seed=1)
    masked = MaskedTokens(base, mask_id=50, mask_prob=0.15, seed=1)
    original, _ = base[3]
    inputs, targets = masked[3]
    hidden = inputs == 50
    assert 10 < hidden.sum() < 50  # about 15% of 200
    assert torch.equal(targets[hidden], original[hidden])
    assert (targets[~hidden] == -100).all()
    assert torch.equal(inputs[~hidden], original[~hidden])
    again, _ = MaskedTokens(base, mask_id=50, mask_prob=0.15, seed=1)[3]
    assert torch.equal(inputs, again)
    # Even a tiny probability hides at least one token: every sample has a target.
    rare_inputs, _ = MaskedTokens(base, mask_id=50, mask_prob=1e-9, seed=1)[3]
    assert (rare_inputs == 50).sum() == 1


def test_encoder_preset_gets_masked_data():
    config = load_config(None, ["model.preset=bert-tiny", "data.vocab_size=40"], env={})
    inputs, targets = build_dataset(config)[0]
    assert (inputs == 40).any() and (targets == -100).any()


def test_the_sampled_maximum_sees_ids_at_both_ends_of_a_large_file(tmp_path):
    tokens = np.zeros(5_000_000, dtype=np.uint16)
    tokens[-1] = 60_000  # the last token: a sample that skipped the end would miss it
    tokens.tofile(tmp_path / "end.bin")
    assert sampled_max_token(tmp_path / "end.bin", "uint16") == 60_000
    tokens[-1], tokens[0] = 0, 50_000
    tokens.tofile(tmp_path / "start.bin")
    assert sampled_max_token(tmp_path / "start.bin", "uint16") == 50_000


def test_a_window_with_an_id_beyond_the_vocabulary_says_so(tmp_path):
    np.array([1, 2, 99, 3, 4], dtype=np.uint16).tofile(tmp_path / "t.bin")
    windows = token_file(tmp_path / "t.bin", dtype="uint16", seq_len=4, vocab_size=64)
    with pytest.raises(ValueError, match="token id 99 at window 0 is not below the vocabulary"):
        windows[0]


# Held by a thread of the test process while DataLoader starts its workers.
HELD_BY_A_THREAD = threading.Lock()


class NeedsTheLock(Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> int:
        # A forked worker inherits the lock as held, and no thread of its own will release it.
        if not HELD_BY_A_THREAD.acquire(timeout=5):
            raise RuntimeError("the worker inherited a lock another thread held")
        HELD_BY_A_THREAD.release()
        return index


def test_workers_do_not_inherit_locks_other_threads_hold():
    holding, done = threading.Event(), threading.Event()

    def hold() -> None:
        with HELD_BY_A_THREAD:
            holding.set()
            done.wait()

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    holding.wait()
    try:
        dataset = NeedsTheLock()
        loaded = [int(item) for item in DataLoader(dataset, **worker_processes(2, dataset))]
        with pytest.raises(RuntimeError, match="inherited a lock"):
            list(DataLoader(NeedsTheLock(), num_workers=1, multiprocessing_context="fork"))
    finally:
        done.set()
        holder.join()
    assert sorted(loaded) == [0, 1, 2, 3]


def test_no_workers_loads_in_the_process_itself():
    # DataLoader raises ValueError for a start method without workers.
    dataset = NeedsTheLock()
    loaded = [int(item) for item in DataLoader(dataset, **worker_processes(0, dataset))]
    assert loaded == [0, 1, 2, 3]


def test_workers_start_with_the_datasets_module_already_imported():
    """The fork server imported it once: no worker imports torch and the dataset itself at
    each epoch. In a fresh interpreter, whose fork server has not started yet."""
    code = (
        "import os\n"
        "from torch.utils.data import DataLoader\n"
        "from tests.training.forked_dataset import WhereImported\n"
        "from training.data import worker_processes\n"
        "dataset = WhereImported()\n"
        "loader = DataLoader(dataset, batch_size=None, **worker_processes(2, dataset))\n"
        "print(os.getpid(), *[f'{int(a)}:{int(b)}' for a, b in loader])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    )
    main, *items = done.stdout.split()
    imported_in = {pair.split(":")[0] for pair in items}
    workers = {pair.split(":")[1] for pair in items}
    assert len(items) == 2 and len(workers) == 2 and main not in workers
    # One process imported the module for both workers: neither of them, not this one.
    assert len(imported_in) == 1 and imported_in.isdisjoint(workers | {main})


@pytest.mark.parametrize(
    ("setting", "ranks", "cpus", "workers"),
    [("auto", 2, 2, 0), ("auto", 1, 8, 7), ("auto", 4, 48, 10), ("auto", 8, 4, 0), (3, 2, 2, 3)],
)
def test_auto_data_workers_share_the_machine_s_cpus_among_its_ranks(setting, ranks, cpus, workers):
    from training.data import data_workers

    assert data_workers(setting, ranks, cpus=cpus) == workers
