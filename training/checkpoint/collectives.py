"""Which ranks do a checkpoint's file work, and the collectives that run it.

Rank 0 does the file work on a root shared by all nodes; on node-local roots each
node's first rank does it for its node. Every step runs as a collective that hands
every rank all the results, and an exception anywhere becomes a CheckpointError on
every rank, so that no rank is left waiting for one that failed.

The collectives go through a gloo process group of their own, so that the saves
finishing in the background never interleave with the training thread's
(torchtitan's asynchronous checkpointing does the same:
https://github.com/pytorch/torchtitan/blob/main/docs/checkpoint.md).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

import torch.distributed as dist

from training.checkpoint.errors import CheckpointError

T = TypeVar("T")


def distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    return dist.get_rank() if distributed() else 0


def world_size() -> int:
    return dist.get_world_size() if distributed() else 1


def log_on_rank0(logger: logging.Logger, level: int, message: str, *args: Any) -> None:
    """Log once for the job rather than once per rank."""
    if rank() == 0:
        logger.log(level, message, *args)


class Ranks:
    """The ranks of one job as the checkpointer sees them."""

    def __init__(self, *, node_first_rank: bool, on_progress: Callable[[], None] | None = None):
        """``on_progress`` is called after each collective step (the hang watchdog's sign
        that a save or a resume moves on)."""
        self.node_first_rank = node_first_rank
        self.shared_root: bool | None = None  # set once the root was probed
        self._group = None  # the checkpointer's own gloo group (None: the default one)
        self._on_progress = on_progress

    def open(self) -> None:
        """Every rank, from the training thread: make the group the background saves talk
        through (a group is created by all ranks together, in the same order)."""
        if self._group is None and world_size() > 1:
            self._group = dist.new_group(backend="gloo")

    @property
    def is_writer(self) -> bool:
        if self.shared_root is None:
            raise RuntimeError("the checkpoint root was not probed yet")
        return rank() == 0 if self.shared_root else self.node_first_rank

    def on_writers(self, work: Callable[[], T]) -> list[T]:
        """Run ``work`` on the ranks that touch files; every rank gets all their results."""
        return self._run(work, runs_here=self.is_writer)

    def on_rank0(self, work: Callable[[], T]) -> T:
        return self._run(work, runs_here=rank() == 0)[0]

    def on_all(self, work: Callable[[], T]) -> list[T]:
        """Run ``work`` on every rank; every rank gets all the results."""
        return self._run(work, runs_here=True)

    def _run(self, work: Callable[[], T], *, runs_here: bool) -> list[T]:
        outcome: tuple[bool, Any, str | None] = (False, None, None)  # (ran, result, error)
        original: BaseException | None = None
        if runs_here:
            try:
                outcome = (True, work(), None)
            except Exception as exc:
                original = exc
                message = (
                    str(exc) if isinstance(exc, CheckpointError) else f"{type(exc).__name__}: {exc}"
                )
                outcome = (True, None, f"rank {rank()}: {message}")
        if world_size() > 1:
            gathered: list[Any] = [None] * world_size()
            dist.all_gather_object(gathered, outcome, group=self._group)
        else:
            gathered = [outcome]
        if self._on_progress is not None:
            self._on_progress()
        errors = [error for _, _, error in gathered if error is not None]
        if errors:
            raise CheckpointError("; ".join(errors)) from original
        return [result for ran, result, _ in gathered if ran]
