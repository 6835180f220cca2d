"""Writing: the checkpoint engine DeepSpeed writes a save's files through.

DeepSpeed's ``engine.save_checkpoint`` (the public save, documented at
https://deepspeed.readthedocs.io/en/latest/model-checkpointing.html) hands every file's
state to ``engine.checkpoint_engine``, an implementation of its ``CheckpointEngine``
interface (deepspeed/runtime/checkpoint_engine/checkpoint_engine.py, DeepSpeed 0.19.8).
``HostCopyWriter`` implements that interface: it copies each file's tensors to host
memory, into ``StagingBuffers`` kept from one save to the next (the save then returns
while the files are written), and writes through the engine DeepSpeed was configured with.

DeepSpeed picks its checkpoint engine from the ``checkpoint.writer`` config only
(``create_checkpoint_engine`` in deepspeed/runtime/checkpoint_engine/utils.py): torch.save,
the "fast" aio writer, or the "decoupled" one. None of them can stand in here: none
copies to host memory within a budget and returns, none reports a failed write without
raising inside the save (whose barriers would then leave the other ranks waiting), and
the decoupled one hands the live tensors to a subprocess through a torch.multiprocessing
queue, which moves CPU storages into shared memory in place, so the next training step
changes what is being written. No config or argument installs another engine, so
``writing_through`` swaps the engine's ``checkpoint_engine`` attribute, the one
``save_checkpoint`` reads, for the length of one call (training/private_apis.py).
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

import psutil
import torch
import xxhash
from deepspeed.runtime.checkpoint_engine.checkpoint_engine import (
    CheckpointCommitInfo,
    CheckpointEngine,
)

from training.checkpoint.errors import CheckpointError
from training.checkpoint.layout import describe_file
from training.private_apis import checkpoint_engine_swapped, empty_host_cache

# A host copy may take at most this share of the memory available when a save begins
# (shared by the node's ranks): the rest stays for the data loaders and the page cache.
_HOST_COPY_SHARE = 0.5


class StagingBuffers:
    """The host tensors asynchronous saves copy the state into, kept from one save to the next.

    A fresh allocation per save pays, on every save, a page fault and the kernel's zeroing
    for each page of a multi-GB copy: glibc serves large blocks with mmap and unmaps them
    when freed (mallopt(3), M_MMAP_THRESHOLD). And a device-to-host copy into pageable
    memory is synchronous and goes through a driver staging buffer, while page-locked
    memory gets the full bandwidth (CUDA C++ Programming Guide, "Page-Locked Host Memory";
    CUDA Runtime API, "API synchronization behavior"). So the buffers
    of a save are kept once its write is over, and the next save copies into those of the
    same shape, strides and dtype, allocating only what has none. PyTorch's distributed
    checkpoint does the same for its async_save: ``BlockingAsyncStager`` with
    ``cache_staged_state_dict=True`` allocates pinned buffers once
    (``_create_cpu_state_dict(pin_memory=True)``) and copies into them on every later save
    (``_copy_state_dict``) (torch/distributed/checkpoint/staging.py, torch 2.13.0); so does
    DeepSpeed's FastPersist with the one pinned I/O buffer it writes every file through
    (``_setup_for_aio`` in deepspeed/runtime/model_checkpointing/writer_factory.py,
    DeepSpeed 0.19.8).

    A buffer is pinned when its source is on a GPU, plain memory for a CPU source. Buffers
    go out during a save's copy (``copy``) and come back only once that save's write is
    over (``writes_done``): with at most one save in flight, no byte still to be written
    can be overwritten by the next save's copy.
    """

    def __init__(self):
        self._kept: dict[_BufferKey, list[torch.Tensor]] = defaultdict(list)
        self._in_use: list[tuple[_BufferKey, torch.Tensor]] = []
        self._keep_in_use = True

    @property
    def kept_bytes(self) -> int:
        """Host memory the kept buffers hold: the next save reuses it, not more."""
        return sum(_buffer_bytes(b, key.pinned) for key, kept in self._kept.items() for b in kept)

    def copy(self, tensor: torch.Tensor) -> torch.Tensor:
        """A host copy of ``tensor``, in a kept buffer that fits, or in a new one."""
        key = _buffer_key(tensor)
        kept = self._kept[key]
        if kept:
            buffer = kept.pop()
        else:
            # Strides as the source's where it is dense (torch.empty_like's preserve_format),
            # as a plain .to("cpu", copy=True) would give.
            buffer = torch.empty_like(tensor, device="cpu", pin_memory=key.pinned)
        buffer.copy_(tensor.detach())
        self._in_use.append((key, buffer))
        return buffer

    def copies_done(self) -> None:
        """The save's copy is over: kept buffers it did not take (the state changed shape)
        are let go, so that the memory the save was counted on for is there."""
        unused = [(key, b) for key, kept in self._kept.items() for b in kept]
        self._kept = defaultdict(list)
        _let_go(unused)

    def writes_done(self) -> None:
        """The buffers handed out have been written: they are kept for the next save
        (unless ``release`` came in between)."""
        in_use, self._in_use = self._in_use, []
        if self._keep_in_use:
            for key, buffer in in_use:
                self._kept[key].append(buffer)
        else:
            _let_go(in_use)
        self._keep_in_use = True

    def release(self) -> None:
        """Keep nothing: the kept buffers go now, those in use once their write is over."""
        self.copies_done()
        self._keep_in_use = False


class HostCopyWriter(CheckpointEngine):
    """The checkpoint engine DeepSpeed writes through during one save.

    Each file's state is copied to host memory, into ``staging``'s buffers, while
    ``budget`` bytes last, and written later by ``write_pending`` through the engine
    DeepSpeed was configured with; past
    the budget (and with a budget of 0: a blocking save) it is written at once, and
    ``staging`` keeps nothing: host memory is short. Every
    file written is noted. A failed write is recorded rather than raised: DeepSpeed's
    save goes through barriers after each file, and a rank leaving early would leave
    the others waiting there; ``entries`` turns it into an error.

    The manifest's checksums are taken from the written files, so they cannot see a staged
    copy that changed before or while it was written (a stray write into a buffer, a bit
    flipped in host memory): the files would match them. So each staged buffer is
    checksummed as it is copied (XXH3 over chunks, in ``digest_threads`` threads while the
    training thread copies the next tensors: ``_checksum``),
    the save returns only once every checksum is taken (``copied``), and after each file is
    written its buffers are checksummed again: a difference fails the write.
    """

    def __init__(
        self,
        writer: CheckpointEngine,
        *,
        budget: int,
        staging: StagingBuffers,
        on_written: Callable[[], None] | None = None,
        digest_threads: int = 1,
    ):
        super().__init__()
        self.on_written = on_written  # after each file, written or not
        self.name = "host copy"
        self.writer = writer
        self.budget = budget
        self.staging = staging
        self.short_of_memory = False
        # (staged state, path, [(buffer, its checksums as copied, or their futures)])
        self.pending: list[tuple[dict, str, list]] = []
        self.paths: list[Path] = []
        self.failures: list[str] = []
        self.digest_threads = digest_threads
        self._digesting: ThreadPoolExecutor | None = None
        self._info: CheckpointCommitInfo | None = None

    def create(self, info: CheckpointCommitInfo) -> None:
        self._info = info
        self.writer.create(info)

    def makedirs(self, path, exist_ok=False) -> None:
        self.writer.makedirs(path, exist_ok=exist_ok)

    def save(self, state_dict, path: str) -> None:
        size = _staged_bytes(state_dict)
        if size <= self.budget:
            self.budget -= size
            copies: list = []
            staged = _host_copy(state_dict, lambda tensor: self._stage(tensor, copies))
            self.pending.append((staged, path, copies))
            return
        if self.budget > 0:
            self.short_of_memory = True
            self.staging.release()
        self.budget = 0  # the files stay in order: all the rest is written now
        if self.writer.preserves_storage_sharing():
            # What DeepSpeed does for such an engine (a view is saved alone, not its storage),
            # but keeping the containers' types: DeepSpeed's clone_tensors_for_torch_save turns
            # a ZeRO-3 checkpoint's torch.Size param_shapes into tuples, which its own
            # zero_to_fp32 cannot export (shape.numel()).
            state_dict = _host_copy(state_dict, _fresh_host_copy)
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

    def copied(self) -> None:
        """The copy is over: wait for the staged buffers' checksums (the save returns then)."""
        for _, _, copies in self.pending:
            copies[:] = [(buffer, [c.result() for c in checksums]) for buffer, checksums in copies]
        if self._digesting is not None:
            self._digesting.shutdown()
            self._digesting = None

    def write_pending(self) -> None:
        if not self.pending:
            return
        with ThreadPoolExecutor(self.digest_threads, thread_name_prefix="checksum") as pool:
            while self.pending:
                state, path, copies = self.pending.pop(0)
                self._write(state, path, copies, pool)
                del state  # the staging buffers hold the tensors until writes_done
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

    def _stage(self, tensor: torch.Tensor, copies: list) -> torch.Tensor:
        buffer = self.staging.copy(tensor)
        if self._digesting is None:
            self._digesting = ThreadPoolExecutor(self.digest_threads, "checksum")
        copies.append((buffer, [self._digesting.submit(_checksum, c) for c in _chunks(buffer)]))
        return buffer

    def _write(self, state_dict, path: str, copies=(), pool=None) -> None:
        try:
            self.writer.save(state_dict, path)
            if copies and _changed(copies, pool):
                raise _StagedCopyChanged(
                    f"its host copy changed between the copy and the write ({len(copies)} "
                    "staged tensors checked against their checksums taken as they were "
                    "copied): the file does not hold the state the save copied"
                )
        except Exception as exc:
            self.failures.append(f"could not write {path}: {_reason(exc)}: {exc}")
            with contextlib.suppress(OSError):
                Path(path).unlink()
        else:
            self.paths.append(Path(path))
        if self.on_written is not None:
            self.on_written()


def writing_through(engine, writer: HostCopyWriter) -> contextlib.AbstractContextManager:
    """``engine.save_checkpoint`` writes through ``writer`` inside this block (see the
    module's docstring for why no config can do it)."""
    return checkpoint_engine_swapped(engine, writer)


def host_copy_budget(ranks_per_node: int, staging: StagingBuffers) -> int:
    """The bytes this rank may copy to host memory: its share of a share of what is free,
    plus the buffers ``staging`` kept (the copy reuses them: they are not more memory)."""
    available = int(psutil.virtual_memory().available * _HOST_COPY_SHARE) // ranks_per_node
    return available + staging.kept_bytes


def _host_copy(value, copy_tensor):
    """``value`` with every tensor replaced by ``copy_tensor``'s host copy of it."""
    if isinstance(value, torch.Tensor):
        return copy_tensor(value)
    if isinstance(value, dict):
        return type(value)((key, _host_copy(item, copy_tensor)) for key, item in value.items())
    if isinstance(value, list | tuple):
        items = [_host_copy(item, copy_tensor) for item in value]
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
    return value


def _fresh_host_copy(tensor: torch.Tensor) -> torch.Tensor:
    """A copy in storage of its own, dropped once written."""
    return tensor.detach().to("cpu", copy=True)


class _BufferKey(NamedTuple):
    """What a kept buffer must match to take a tensor's copy."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    pinned: bool  # the source is on a GPU


def _buffer_key(tensor: torch.Tensor) -> _BufferKey:
    return _BufferKey(tuple(tensor.shape), tensor.stride(), tensor.dtype, tensor.is_cuda)


def _buffer_bytes(tensor: torch.Tensor, pinned: bool) -> int:
    """The host memory a buffer for ``tensor`` takes. Pinned memory comes from torch's host
    caching allocator, which rounds every block up to a power of two
    (``CachingHostAllocatorImpl::allocate``, aten/src/ATen/core/CachingHostAllocator.h)."""
    size = tensor.numel() * tensor.element_size()
    return 1 << (size - 1).bit_length() if pinned and size > 0 else size


def _staged_bytes(value) -> int:
    """The host memory the staging of ``value``'s tensors takes."""
    if isinstance(value, torch.Tensor):
        return _buffer_bytes(value, value.is_cuda)
    if isinstance(value, dict):
        return sum(_staged_bytes(item) for item in value.values())
    if isinstance(value, list | tuple):
        return sum(_staged_bytes(item) for item in value)
    return 0


def _let_go(buffers: list[tuple[_BufferKey, torch.Tensor]]) -> None:
    """Drop ``buffers``. Pinned ones would stay in torch's cache of pinned blocks, out of
    the OS's reach, until it is emptied (training/private_apis.py)."""
    pinned = any(key.pinned for key, _ in buffers)
    buffers.clear()
    if pinned:
        empty_host_cache()


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return os.strerror(errno.ENOSPC)
    if isinstance(exc, _StagedCopyChanged):
        return "host memory"
    return type(exc).__name__


class _StagedCopyChanged(RuntimeError):
    """A staged buffer no longer holds what was copied into it."""


# A staged buffer is checksummed in chunks of this many bytes, so that the chunks of one
# large tensor (ZeRO's flat optimizer partitions) are hashed in parallel.
_CHECKSUM_CHUNK = 64 << 20


def _chunks(buffer: torch.Tensor) -> list[memoryview]:
    """The bytes of a staged buffer (all of its own storage: staging allocates it dense)."""
    data = torch.empty(0, dtype=torch.uint8).set_(buffer.untyped_storage()).numpy().data
    return [data[start : start + _CHECKSUM_CHUNK] for start in range(0, len(data), _CHECKSUM_CHUNK)]


def _checksum(chunk: memoryview) -> int:
    # update() lets go of the GIL for inputs over 64 KiB (XXHASH_GIL_MINSIZE in
    # ifduyue/python-xxhash src/_xxhash.c, commit 015826529c3728efc6847cb57d3d253ac164fccb),
    # so the checksum threads run beside the training thread's copy.
    digest = xxhash.xxh3_64()
    digest.update(chunk)
    return digest.intdigest()


def _changed(copies: list, pool: ThreadPoolExecutor) -> bool:
    """Whether any buffer's bytes differ from its checksums taken when it was copied."""
    chunks = [chunk for buffer, _ in copies for chunk in _chunks(buffer)]
    now = list(pool.map(_checksum, chunks))
    return now != [checksum for _, checksums in copies for checksum in checksums]
