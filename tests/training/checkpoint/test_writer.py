"""StagingBuffers and the host-copy budget, on their own (tensors, no engine)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from training.checkpoint import writer as writer_module
from training.checkpoint.writer import StagingBuffers


def test_a_buffer_comes_back_for_the_same_shape_and_dtype_only_once_its_write_is_done():
    staging = StagingBuffers()
    source = torch.arange(6.0).reshape(2, 3)
    first = staging.copy(source)
    assert torch.equal(first, source) and first.data_ptr() != source.data_ptr()
    staging.copies_done()
    second = staging.copy(source)  # the first still being written: a buffer of its own
    assert second.data_ptr() != first.data_ptr()
    staging.copies_done()
    staging.writes_done()
    assert staging.kept_bytes == 2 * 6 * 4
    reused = staging.copy(source + 1)
    assert reused.data_ptr() in (first.data_ptr(), second.data_ptr())
    assert torch.equal(reused, torch.arange(1.0, 7.0).reshape(2, 3))
    other_shape = staging.copy(torch.zeros(3, 2))
    other_dtype = staging.copy(torch.zeros(2, 3, dtype=torch.float64))
    assert other_dtype.dtype == torch.float64
    ours = {first.data_ptr(), second.data_ptr()}
    assert other_shape.data_ptr() not in ours and other_dtype.data_ptr() not in ours


def test_a_copy_keeps_the_sources_strides():
    staging = StagingBuffers()
    transposed = torch.arange(12.0).reshape(3, 4).t()
    copy = staging.copy(transposed)
    assert copy.stride() == (1, 4) and torch.equal(copy, transposed)
    view = torch.arange(6.0)[:4]  # a view: its copy holds only its own 4 elements
    assert staging.copy(view).untyped_storage().nbytes() == 4 * 4


def test_kept_buffers_a_save_does_not_take_are_let_go_when_its_copy_is_done():
    staging = StagingBuffers()
    staging.copy(torch.zeros(10))
    staging.copies_done()
    staging.writes_done()
    assert staging.kept_bytes == 40
    staging.copy(torch.zeros(5))  # the state changed shape
    staging.copies_done()
    assert staging.kept_bytes == 0
    staging.writes_done()
    assert staging.kept_bytes == 20


def test_released_while_in_use_nothing_is_kept_after_the_write():
    staging = StagingBuffers()
    staging.copy(torch.zeros(10))
    staging.release()
    staging.writes_done()
    assert staging.kept_bytes == 0
    staging.copy(torch.zeros(10))  # the next save keeps its buffers again
    staging.copies_done()
    staging.writes_done()
    assert staging.kept_bytes == 40


def test_the_budget_counts_the_kept_buffers_as_available(monkeypatch):
    monkeypatch.setattr(
        writer_module.psutil, "virtual_memory", lambda: SimpleNamespace(available=1000)
    )
    staging = StagingBuffers()
    # Half of what is available, shared by 2 ranks: 250 bytes.
    assert writer_module.host_copy_budget(2, staging) == 250
    staging.copy(torch.zeros(10))
    staging.copies_done()
    staging.writes_done()
    assert writer_module.host_copy_budget(2, staging) == 250 + 40


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_a_gpu_tensors_buffer_is_pinned_and_counted_as_the_host_allocator_rounds_it():
    staging = StagingBuffers()
    source = torch.arange(750.0, device="cuda")  # 3,000 bytes
    copy = staging.copy(source)
    assert copy.device.type == "cpu" and copy.is_pinned()
    assert torch.equal(copy, source.cpu())
    staging.copies_done()
    staging.writes_done()
    assert staging.kept_bytes == 4096
    assert staging.copy(source).data_ptr() == copy.data_ptr()
    assert not staging.copy(torch.zeros(750)).is_pinned()
