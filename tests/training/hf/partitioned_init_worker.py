"""One rank of the partitioned-construction test of a Hugging Face model: build it as the
trainer does at ZeRO-3 (from_pretrained under transformers' DeepSpeed integration), then,
on rank 0, once more without partitioning; write the most parameter elements each build
held at once.

    torchrun --nproc_per_node=2 -m tests.training.hf.partitioned_init_worker OUT MODEL

The count (tests/training/partitioned_init_worker.py's LiveParameters) is sampled when a
module registers a parameter and, here, whenever a module's parameters are gathered to
load or initialise them (deepspeed.zero.GatheredParameters): the moments a rank holds the
most.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import deepspeed
import torch
from torch.nn.modules.module import register_module_parameter_registration_hook

from tests.training.partitioned_init_worker import LiveParameters
from training.ds_config import build_ds_config
from training.hf.model import build
from training.spec.config import load_config, resolve_batch_sizes


def measured(make) -> tuple[int, int]:
    """(peak live parameter elements, the model's full count) of one build."""
    counter = LiveParameters()
    handle = register_module_parameter_registration_hook(counter)
    gathered = deepspeed.zero.GatheredParameters.__enter__

    def enter(self):
        result = gathered(self)
        counter.sample()  # the module's parameters are whole now
        return result

    deepspeed.zero.GatheredParameters.__enter__ = enter
    try:
        model = make()
    finally:
        deepspeed.zero.GatheredParameters.__enter__ = gathered
        handle.remove()
    counter.sample()
    full = sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters())
    return counter.peak, full


def main() -> None:
    out, model_folder = Path(sys.argv[1]), Path(sys.argv[2])
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    job = out / "job.toml"
    if rank == 0:
        job.write_text(
            f'[model]\nhf = "{model_folder}"\n[data]\nkind = "jsonl"\npath = "x.jsonl"\n'
            "[zero]\nstage = 3\n"
        )
    torch.distributed.barrier()
    config = load_config(job)
    ds_config = build_ds_config(config, resolve_batch_sizes(config.train, world), on_gpu=False)
    peak, full = measured(lambda: build(config, model_folder, ds_config, on_gpu=False))
    result = {"partitioned_peak": peak, "full": full}
    torch.distributed.barrier()
    if rank == 0:
        result["whole_peak"], _ = measured(lambda: build(config, model_folder, None, on_gpu=False))
    (out / f"rank{rank}.json").write_text(json.dumps(result))
    torch.distributed.barrier()


if __name__ == "__main__":
    main()
