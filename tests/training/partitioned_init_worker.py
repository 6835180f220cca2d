"""One rank of the partitioned-construction test: build the model as the trainer does at
ZeRO-3 (MODE partitioned) or without partitioning (MODE whole), and write what it held at
its peak. One build per process, so that neither sees the other's freed memory.

    torchrun --nproc_per_node=2 partitioned_init_worker.py OUT_DIR MODE --set key=value ...

Two measures, written to OUT_DIR/<MODE>-rank<r>.json:
- live_param_elements: the most parameter elements alive at once, sampled each time a
  module registers a parameter (a partitioned parameter counts its local shard);
- rss_growth_bytes: the process's peak resident memory during the build less its resident
  memory before (an upper bound of what the build held at once).
"""

from __future__ import annotations

import json
import sys
import weakref
from pathlib import Path

import deepspeed
import psutil
import torch
from torch.nn.modules.module import register_module_parameter_registration_hook

from training.components import build_model
from training.ds_config import build_ds_config
from training.spec.config import load_config, resolve_batch_sizes


class LiveParameters:
    """The peak number of parameter elements alive, sampled at every registration."""

    def __init__(self):
        self.params: list[weakref.ref] = []
        self.peak = 0

    def __call__(self, _module, _name, param):
        if param is not None:
            self.params.append(weakref.ref(param))
        self.sample()

    def sample(self) -> None:
        live = 0
        for ref in self.params:
            param = ref()
            if param is not None:
                live += param.data.numel()
                shard = getattr(param, "ds_tensor", None)
                live += shard.numel() if shard is not None else 0
        self.peak = max(self.peak, live)


def reset_peak_rss() -> None:
    """Start the peak over from now: writing 5 to clear_refs resets VmHWM (Linux 4.0+,
    Documentation/filesystems/proc.rst), so what the process held before the build
    (imports, the backend's start-up) does not count as the build's."""
    Path("/proc/self/clear_refs").write_text("5")


def peak_rss_bytes() -> int:
    """VmHWM, the peak resident memory since the last reset."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024  # kB
    raise RuntimeError("no VmHWM in /proc/self/status")


def measure(build) -> dict:
    counter = LiveParameters()
    handle = register_module_parameter_registration_hook(counter)
    reset_peak_rss()
    before = psutil.Process().memory_info().rss
    try:
        model = build()
    finally:
        handle.remove()
    counter.sample()
    grown = peak_rss_bytes() - before
    full = sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters())
    del model
    return {"live_param_elements": counter.peak, "rss_growth_bytes": grown, "full": full}


def main() -> None:
    out, mode = Path(sys.argv[1]), sys.argv[2]
    overrides = [a for a in sys.argv[3:] if a != "--set"]
    deepspeed.init_distributed(dist_backend="gloo")
    rank = torch.distributed.get_rank()
    config = load_config(None, overrides)
    batch = resolve_batch_sizes(config.train, torch.distributed.get_world_size())
    ds_config = build_ds_config(config, batch, on_gpu=False)
    torch.manual_seed(0)
    result = measure(lambda: build_model(config, ds_config if mode == "partitioned" else None))
    (out / f"{mode}-rank{rank}.json").write_text(json.dumps(result))
    torch.distributed.barrier()


if __name__ == "__main__":
    main()
