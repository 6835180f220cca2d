"""One rank of a checkpoint test job, started by torch.distributed.run.

    checkpoint_worker.py save ROOT OUT.pt S3_URI     train 4 steps, save step 4
    checkpoint_worker.py resume ROOT OUT.pt S3_URI   resume, then train 2 more steps

"{node}" in ROOT becomes the node's rank (each node gets its own disk).
Rank 0 writes what it saw to OUT.pt for the test to compare.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import deepspeed
import torch
import torch.distributed as dist

from tests.training.checkpoint_engine import build_engine, train_step, weights
from training.checkpoint.checkpointer import Checkpointer
from training.checkpoint.s3 import S3Mirror


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["save", "resume"])
    parser.add_argument("root")
    parser.add_argument("out", type=Path)
    parser.add_argument("s3_uri")
    args = parser.parse_args()

    deepspeed.init_distributed(dist_backend="gloo")
    root = Path(args.root.format(node=os.environ["GROUP_RANK"]))
    checkpointer = Checkpointer(
        root,
        mirror=S3Mirror.from_uri(args.s3_uri),
        node_first_rank=os.environ["LOCAL_RANK"] == "0",
        ranks_per_node=int(os.environ["LOCAL_WORLD_SIZE"]),
    )
    if args.mode == "save":
        engine = build_engine()
        for step in range(4):
            train_step(engine, step)
        checkpointer.save(engine, 4, {"step": 4, "note": f"saved by {dist.get_world_size()} ranks"})
        report = {"weights": weights(engine)}
    else:
        # As the trainer does: the checkpoint first, then an engine built to load it.
        point = checkpointer.choose_resume(dist.get_world_size())
        engine = build_engine(
            seed=1, load_universal=point is not None and point.deepspeed_loads_universal
        )
        client_state = checkpointer.resume(engine)
        report = {
            "client_state": client_state,
            "weights_after_load": weights(engine),
            "global_steps_after_load": engine.global_steps,
        }
        for step in (4, 5):
            train_step(engine, step)
        report["weights_after_training"] = weights(engine)
        report["global_steps_after_training"] = engine.global_steps
    if dist.get_rank() == 0:
        torch.save(report, args.out)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
