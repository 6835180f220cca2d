"""Writing: the checkpoint engine DeepSpeed writes a save's files through.

DeepSpeed's ``engine.save_checkpoint`` (the public save, documented at
https://deepspeed.readthedocs.io/en/latest/model-checkpointing.html) hands every file's
state to ``engine.checkpoint_engine``, an implementation of its ``CheckpointEngine``
interface (deepspeed/runtime/checkpoint_engine/checkpoint_engine.py, DeepSpeed 0.19.8).
``HostCopyWriter`` implements that interface: it copies each file's tensors to host
memory (the save then returns while the files are written) and writes through the
engine DeepSpeed was configured with.

DeepSpeed picks its checkpoint engine from the ``checkpoint.writer`` config only
(``create_checkpoint_engine`` in deepspeed/runtime/checkpoint_engine/utils.py): torch.save,
the "fast" aio writer, or the "decoupled" one. None of them can stand in here: none
copies to host memory within a budget and returns, none reports a failed write without
raising inside the save (whose barriers would then leave the other ranks waiting), and
the decoupled one hands the live tensors to a subprocess through a torch.multiprocessing
queue, which moves CPU storages into shared memory in place, so the next training step
changes what is being written. No config or argument installs another engine, so
``writing_through`` sets the engine's public ``checkpoint_engine`` attribute, the one
``save_checkpoint`` reads, for the length of one call, and puts the configured one back.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator
from pathlib import Path

import psutil
import torch
from deepspeed.runtime.checkpoint_engine.checkpoint_engine import (
    CheckpointCommitInfo,
    CheckpointEngine,
)

from training.checkpoint.errors import CheckpointError
from training.checkpoint.layout import describe_file

# A host copy may take at most this share of the memory available when a save begins
# (shared by the node's ranks): the rest stays for the data loaders and the page cache.
_HOST_COPY_SHARE = 0.5


class HostCopyWriter(CheckpointEngine):
    """The checkpoint engine DeepSpeed writes through during one save.

    Each file's state is copied to host memory while ``budget`` bytes last, and written
    later by ``write_pending`` through the engine DeepSpeed was configured with; past
    the budget (and with a budget of 0: a blocking save) it is written at once. Every
    file written is noted. A failed write is recorded rather than raised: DeepSpeed's
    save goes through barriers after each file, and a rank leaving early would leave
    the others waiting there; ``entries`` turns it into an error.
    """

    def __init__(self, writer: CheckpointEngine, *, budget: int):
        super().__init__()
        self.name = "host copy"
        self.writer = writer
        self.budget = budget
        self.short_of_memory = False
        self.pending: list[tuple[dict, str]] = []
        self.paths: list[Path] = []
        self.failures: list[str] = []
        self._info: CheckpointCommitInfo | None = None

    def create(self, info: CheckpointCommitInfo) -> None:
        self._info = info
        self.writer.create(info)

    def makedirs(self, path, exist_ok=False) -> None:
        self.writer.makedirs(path, exist_ok=exist_ok)

    def save(self, state_dict, path: str) -> None:
        size = _tensor_bytes(state_dict)
        if size <= self.budget:
            self.budget -= size
            self.pending.append((_host_copy(state_dict), path))
            return
        self.short_of_memory = self.short_of_memory or self.budget > 0
        self.budget = 0  # the files stay in order: all the rest is written now
        if self.writer.preserves_storage_sharing():
            # What DeepSpeed does for such an engine (a view is saved alone, not its storage),
            # but keeping the containers' types: DeepSpeed's clone_tensors_for_torch_save turns
            # a ZeRO-3 checkpoint's torch.Size param_shapes into tuples, which its own
            # zero_to_fp32 cannot export (shape.numel()).
            state_dict = _host_copy(state_dict)
        self._write(state_dict, path)

    def load(self, path: str, map_location=None):
        return self.writer.load(path, map_location=map_location)

    def commit(self, info: CheckpointCommitInfo) -> bool:
        # With files still in memory, the configured engine commits after write_pending.
        return True if self.pending else self.writer.commit(info)

    def is_data_parallel_writer(self, dp_rank) -> bool:
        return self.writer.is_data_parallel_writer(dp_rank)

    def preserves_storage_sharing(self) -> bool:
        return False  # every tensor is copied (or cloned) on its own before it is written

    def write_pending(self) -> None:
        if not self.pending:
            return
        while self.pending:
            state, path = self.pending.pop(0)
            self._write(state, path)
            del state  # its host memory goes back file by file
        if self._info is not None:
            self.writer.commit(self._info)

    def entries(self, step_dir: Path) -> dict[str, dict]:
        """The manifest entry of every file this rank wrote; raises a failed write."""
        if self.failures:
            raise CheckpointError("; ".join(self.failures))
        return {
            path.relative_to(step_dir).as_posix(): describe_file(path)
            for path in self.paths
            if path.is_relative_to(step_dir)
        }

    def _write(self, state_dict, path: str) -> None:
        try:
            self.writer.save(state_dict, path)
        except Exception as exc:
            self.failures.append(f"could not write {path}: {_reason(exc)}: {exc}")
            with contextlib.suppress(OSError):
                Path(path).unlink()
        else:
            self.paths.append(Path(path))


@contextlib.contextmanager
def writing_through(engine, writer: HostCopyWriter) -> Iterator[None]:
    """``engine.save_checkpoint`` writes through ``writer`` inside this block (see the
    module's docstring for why no config can do it)."""
    configured = engine.checkpoint_engine
    engine.checkpoint_engine = writer
    try:
        yield
    finally:
        engine.checkpoint_engine = configured


def host_copy_budget(ranks_per_node: int) -> int:
    """The bytes this rank may copy to host memory: its share of a share of what is free."""
    return int(psutil.virtual_memory().available * _HOST_COPY_SHARE) // ranks_per_node


def _host_copy(value):
    """``value`` with every tensor copied to host memory, each into storage of its own."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return type(value)((key, _host_copy(item)) for key, item in value.items())
    if isinstance(value, list | tuple):
        items = [_host_copy(item) for item in value]
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
    return value


def _tensor_bytes(value) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, dict):
        return sum(_tensor_bytes(item) for item in value.values())
    if isinstance(value, list | tuple):
        return sum(_tensor_bytes(item) for item in value)
    return 0


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return os.strerror(errno.ENOSPC)
    return type(exc).__name__
