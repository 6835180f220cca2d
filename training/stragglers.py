"""The straggler report: which rank makes the others wait, measured per logging window.

In data-parallel training every rank waits for the slowest at each gradient reduction, so
whole-step times are equal on all ranks and say nothing. What differs is each rank's own
work before it joins the step's first collective: fetching its batch and running the
forward pass. This module times both (the batch iterator wrapped, the forward pass through
module hooks; CUDA events on a GPU, whose kernels run asynchronously), gathers each rank's
per-step figure at every logging window, and compares the slowest with the median. A rank
slower by straggler_factor for straggler_windows windows in a row is named in the log, in
the window's metrics record and in status.json.

Under ZeRO-3 the forward pass gathers parameters (a collective), so waiting on others is
part of every rank's forward time there and a straggler shows less.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch import nn

from training.spec.config import WatchdogConfig

log = logging.getLogger(__name__)


class _ForwardTimer:
    """Seconds spent in the model's forward passes since the last `take()`."""

    def __init__(self, model: nn.Module, on_gpu: bool):
        self.on_gpu = on_gpu
        self.seconds = 0.0
        self._started = 0.0
        self._events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        model.register_forward_pre_hook(self._before)
        model.register_forward_hook(self._after)

    def _before(self, module: nn.Module, _inputs) -> None:
        if not module.training:  # an evaluation: every rank does its equal share
            return
        if self.on_gpu:
            pair = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            self._events.append(pair)
            pair[0].record()
        else:
            self._started = time.perf_counter()

    def _after(self, module: nn.Module, _inputs, _output) -> None:
        if not module.training:
            return
        if self.on_gpu:
            self._events[-1][1].record()
        else:
            self.seconds += time.perf_counter() - self._started

    def take(self) -> float:
        if self._events:
            self._events[-1][1].synchronize()
            self.seconds += sum(start.elapsed_time(end) for start, end in self._events) / 1000
            self._events.clear()
        seconds, self.seconds = self.seconds, 0.0
        return seconds


class StragglerReport:
    """Each rank's own work per step, compared across ranks at every logging window."""

    def __init__(
        self, model: nn.Module, settings: WatchdogConfig, device: torch.device, step: int, node: str
    ):
        self.settings, self.device, self.node = settings, device, node
        self.forward = _ForwardTimer(model, on_gpu=device.type == "cuda")
        self.data_s = 0.0
        self.window_start_step = step
        self.streak: tuple[int, int] | None = None  # (rank, windows in a row)
        self.nodes = [""] * dist.get_world_size()
        dist.all_gather_object(self.nodes, self.node)

    def timed(self, batches: Iterator) -> Iterator:
        """`batches`, with the time each next() takes counted as this rank's work."""
        while True:
            started = time.perf_counter()
            batch = next(batches)
            self.data_s += time.perf_counter() - started
            yield batch

    def window(self, step: int) -> dict[str, float | int]:
        """A collective: every rank calls it at the same step. The fields for rank 0's
        metrics record (empty elsewhere, and where there is one rank)."""
        steps = max(step - self.window_start_step, 1)
        local = (self.data_s + self.forward.take()) / steps
        self.data_s, self.window_start_step = 0.0, step
        every = [torch.zeros(1, device=self.device) for _ in self.nodes]
        dist.all_gather(every, torch.tensor([local], device=self.device))
        if dist.get_rank() != 0 or len(every) < 2:
            return {}
        seconds = [float(value) for value in every]
        slowest = max(range(len(seconds)), key=seconds.__getitem__)
        median = statistics.median(seconds)
        ratio = seconds[slowest] / median if median > 0 else 1.0
        fields: dict[str, float | int] = {
            "slowest_rank": slowest,
            "slowest_rank_ratio": ratio,
            "median_rank_work_s": median,
        }
        if ratio < self.settings.straggler_factor:
            self.streak = None
            return fields
        windows = self.streak[1] + 1 if self.streak and self.streak[0] == slowest else 1
        self.streak = (slowest, windows)
        if windows >= self.settings.straggler_windows:
            fields["straggler_rank"] = slowest
            log.warning(
                "straggler: rank %d on node %s spent %.1fx the median rank's own work per step "
                "(%.3f s against %.3f s: batch and forward pass) for %d logging windows in a row",
                slowest,
                self.nodes[slowest],
                ratio,
                seconds[slowest],
                median,
                windows,
            )
        return fields
