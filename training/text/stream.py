"""The training split read while training (`data.streaming = true`): for data larger than
the node's disk, nothing is prepared or cached; each rank reads its share of the records
as they stream in, tokenizes and packs them.

Built on Hugging Face datasets' streaming (training/text/sources.py says why that
library): `split_dataset_by_node` gives each rank whole files when their number divides
by the world size (else every rank reads everything and keeps one record in world
size), a batched `map` tokenizes BATCH records at a time and packs them into windows
(training/text/packing.py's, boundaries kept; the tokens left over at a batch's end, less
than one window, are dropped), and the stream's `state_dict` is its exact position: the
trainer saves every rank's in the checkpoint and a resume continues at the next window
(datasets' IterableDataset.state_dict: exact without shuffle buffers, which this does not
use: shuffle the files beforehand). A rank that reaches the end of its share starts the
next epoch on its own.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import IterableDataset

from training.spec.config import Config, ConfigError
from training.text import sources
from training.text.packing import causal_window
from training.text.tokenize import Encoder, Settings, check_fields

BATCH = 256  # records tokenized and packed together
_COLUMNS = ("inputs", "targets", "positions")


def first_record(config: Config, records=None) -> dict:
    """The stream's first record, checked for the fields the job reads (the launcher asks
    before any rank starts: ConfigError naming the fields it has)."""
    records = sources.records(config, "train") if records is None else records
    first = next(iter(records), None)
    if first is None:
        raise ConfigError(f"data.path = {config.data.path!r} holds no records")
    check_fields(Settings.of(config), first, config.data.path)
    return first


class StreamedWindows(IterableDataset):
    """This rank's packed windows, forever, epoch after epoch; a position that survives a
    restart (`state_dict`, `load_state_dict`)."""

    def __init__(self, config: Config, model_folder: Path, *, rank: int, world_size: int):
        from datasets.distributed import split_dataset_by_node

        self.seq_len = config.data.seq_len
        self.encoder = Encoder.from_folder(
            model_folder, Settings.of(config), config.model.trust_remote_code
        )
        records = sources.records(config, "train")
        first = first_record(config, records)
        mine = split_dataset_by_node(records, rank=rank, world_size=world_size)
        self.windows = mine.map(
            self._pack, batched=True, batch_size=BATCH, remove_columns=list(first)
        )
        self.epoch = 0
        self.consumed = 0  # windows this rank has used in the current epoch

    def _pack(self, batch: dict[str, list]) -> dict[str, list]:
        columns = list(batch)
        rows = zip(*batch.values(), strict=True)
        records = [dict(zip(columns, values, strict=True)) for values in rows]
        documents = self.encoder(records)
        tokens = np.concatenate([d.ids for d in documents]) if documents else np.zeros(0)
        starts = np.cumsum([0] + [len(d.ids) for d in documents])
        trained = None
        if any(d.trained is not None for d in documents):
            trained = np.concatenate([d.trained for d in documents])
        count = max(0, (len(tokens) - 1) // self.seq_len)
        windows = [
            causal_window(tokens, starts, trained, i * self.seq_len, self.seq_len)
            for i in range(count)
        ]
        return {name: [w[part] for w in windows] for part, name in enumerate(_COLUMNS)}

    def __iter__(self) -> Iterator[tuple[torch.Tensor, ...]]:
        while True:
            self.windows.set_epoch(self.epoch)
            for window in self.windows:
                self.consumed += 1
                yield tuple(torch.as_tensor(window[name], dtype=torch.long) for name in _COLUMNS)
            if self.consumed == 0:
                raise ValueError("this rank's share of the streamed data holds no whole window")
            # A new epoch number starts the stream over (a loaded position applies to its
            # own epoch only: datasets' IterableDataset._starting_state_dict).
            self.epoch, self.consumed = self.epoch + 1, 0

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "consumed": self.consumed, "stream": self.windows.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.consumed = state["epoch"], state["consumed"]
        self.windows.load_state_dict(state["stream"])
