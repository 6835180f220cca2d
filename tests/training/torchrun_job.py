"""A torchrun script run as a command job (tests/training/test_command_job.py): two ranks
in one gloo group, rank 0 saves to $CHECKPOINT_DIR each step, and on SIGTERM every rank
stops after the same step (the flag all-reduced), rank 0 saves and all exit 75."""

import json
import os
import signal
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

steps = int(sys.argv[sys.argv.index("--steps") + 1])
state_file = Path(os.environ["CHECKPOINT_DIR"]) / "state.json"
stopping = torch.zeros(1)
signal.signal(signal.SIGTERM, lambda signum, frame: stopping.fill_(1))
dist.init_process_group("gloo")
rank = dist.get_rank()
step = json.loads(state_file.read_text())["step"] if state_file.exists() else 0
print(f"rank {rank} of {dist.get_world_size()}: from step {step}", flush=True)
while step < steps:
    time.sleep(0.2)  # one step of work
    step += 1
    if rank == 0:
        saving = state_file.with_suffix(".tmp")
        saving.write_text(json.dumps({"step": step}))
        saving.replace(state_file)
    asked = stopping.clone()
    dist.all_reduce(asked, op=dist.ReduceOp.MAX)  # one rank's signal stops them all
    if asked.item():
        dist.barrier()  # rank 0's save is on disk before any rank leaves
        print(f"rank {rank} saved at step {step}; exit 75", flush=True)
        dist.destroy_process_group()
        sys.exit(75)
print(f"rank {rank} done at step {step}", flush=True)
dist.destroy_process_group()
