"""A command job: `gpu-stack run STACK --code examples -- python command_job.py --steps 20`.

What any script run as a job must do: save on SIGTERM and exit 75 (the stack runs it again
later), and resume from $CHECKPOINT_DIR. torchrun scripts do the same on each rank 0.
"""

import json
import os
import signal
import sys
import time
from pathlib import Path

steps = int(sys.argv[sys.argv.index("--steps") + 1]) if "--steps" in sys.argv else 20
state_file = Path(os.environ["CHECKPOINT_DIR"]) / "state.json"
stopping = False


def stop(signum, frame):
    global stopping
    stopping = True  # finish the step at hand, then save


signal.signal(signal.SIGTERM, stop)
step = json.loads(state_file.read_text())["step"] if state_file.exists() else 0
print(f"rank {os.environ['NODE_RANK']} of {os.environ['NNODES']}: from step {step}", flush=True)
while step < steps:
    time.sleep(0.2)  # one step of work
    step += 1
    saving = state_file.with_suffix(".tmp")  # a real job saves every N steps
    saving.write_text(json.dumps({"step": step}))
    saving.replace(state_file)  # whole or not at all
    if stopping:
        print(f"saved at step {step}; exit 75 to be resumed", flush=True)
        sys.exit(75)
print(f"done at step {step}", flush=True)
