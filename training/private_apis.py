"""Every use of a DeepSpeed or torch name outside their public APIs, in one place.

The trainer uses DeepSpeed and torch through their public APIs, except for the four needs
below, which neither library offers a public way to meet. Each function names the version
it was written against and the source lines it relies on; tests/training/test_private_apis.py
checks each of those facts against the installed library, so a release that changes one
fails that test, not a training run.

Written against DeepSpeed 0.19.8 (requirements-train.txt) and torch 2.10 (the cu128 image)
to 2.13 (the CPU image).
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

# DeepSpeed 0.19.8, deepspeed/runtime/engine.py: `save_checkpoint` (line 4869) and the
# helpers it calls write every file through `self.checkpoint_engine` (lines 4899, 4909,
# 5289, 5354, 5404, 5564), an attribute set once in `_configure_checkpointing` (line 1902)
# from the `checkpoint.writer` config (create_checkpoint_engine,
# deepspeed/runtime/checkpoint_engine/utils.py); no argument or config installs another.
CHECKPOINT_ENGINE_ATTRIBUTE = "checkpoint_engine"


@contextlib.contextmanager
def checkpoint_engine_swapped(engine, writer) -> Iterator[None]:
    """`engine.save_checkpoint` writes through `writer` (a DeepSpeed CheckpointEngine) inside
    this block; the configured engine is put back after it."""
    configured = getattr(engine, CHECKPOINT_ENGINE_ATTRIBUTE)
    setattr(engine, CHECKPOINT_ENGINE_ATTRIBUTE, writer)
    try:
        yield
    finally:
        setattr(engine, CHECKPOINT_ENGINE_ATTRIBUTE, configured)


def on_op_build(began: Callable[[str], None], ended: Callable[[float, float], None]) -> None:
    """Call `began(op name)` when DeepSpeed JIT-loads an op, and `ended(start, end)` (Unix
    times) when the load returns.

    DeepSpeed 0.19.8 loads every JIT op through `OpBuilder.jit_load(self, verbose=True)`
    (deepspeed/ops/op_builder/builder.py, line 568) and has no hook to be told; the method is
    wrapped, once per process.
    """
    import time

    from deepspeed.ops.op_builder.builder import OpBuilder

    jit_load = OpBuilder.jit_load

    def timed_jit_load(self, *args, **kwargs):
        began(self.name)
        start = time.time()
        try:
            return jit_load(self, *args, **kwargs)
        finally:
            ended(start, time.time())

    OpBuilder.jit_load = timed_jit_load


def universal_conversion_arguments(input_folder: Path, output_folder: Path) -> argparse.Namespace:
    """The arguments of DeepSpeed's ds_to_universal for one conversion in this process.

    DeepSpeed 0.19.8, deepspeed/checkpoint/ds_to_universal.py: the converter is a script
    whose `main(args)` (line 1156) takes the namespace its `parse_arguments()` (line 71)
    builds from sys.argv; there is no function that takes the folders. One worker each: the
    conversion runs inside a training rank, which must not fork a pool.
    """
    return argparse.Namespace(
        input_folder=str(input_folder),
        output_folder=str(output_folder),
        num_extract_workers=1,
        num_merge_workers=1,
        keep_temp_folder=False,
        strict=True,
        inject_missing_state=False,
    )


def convert_to_universal(input_folder: Path, output_folder: Path) -> None:
    """DeepSpeed's universal checkpoint of `input_folder`, written to `output_folder`
    (https://www.deepspeed.ai/tutorials/universal-checkpointing/)."""
    from deepspeed.checkpoint import ds_to_universal

    ds_to_universal.main(universal_conversion_arguments(input_folder, output_folder))


def empty_host_cache() -> None:
    """Give the pinned blocks torch's host caching allocator keeps back to the OS.

    Public since pytorch/pytorch#171270 as `torch.accelerator.empty_host_cache` (torch 2.13
    has it); torch 2.10, the cu128 image's, has only `torch._C._host_emptyCache`
    (pytorch/pytorch#134332, torch 2.5).
    """
    import torch

    public = getattr(torch.accelerator, "empty_host_cache", None)
    if public is not None:
        public()
    else:
        torch._C._host_emptyCache()
