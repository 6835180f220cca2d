"""One rank of a stop-flag test job, started by torch.distributed.run.

    stop_worker.py OUT_DIR [SPOT_ENDPOINT]

Writes OUT_DIR/pid-<rank>, then runs "steps" (short sleeps), asking the stop
flag after each one, and finally writes OUT_DIR/stopped-<rank>.json with the
step it stopped after and the reason it saw. Exits 3 if no stop ever came.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch.distributed as dist

from training.environment import read_environment
from training.interrupt import StopFlag, spot_endpoint_from_env

MAX_STEPS = 3000


def main() -> int:
    out = Path(sys.argv[1])
    # As the worker chooses it: only each node's first rank polls (empty: polling off).
    env = replace(read_environment(), spot_endpoint=sys.argv[2] if len(sys.argv) > 2 else "")
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    flag = StopFlag(spot_endpoint=spot_endpoint_from_env(env), poll_interval_s=0.1)
    flag.start()
    (out / f"pid-{rank}").write_text(str(os.getpid()))
    for step in range(1, MAX_STEPS + 1):
        time.sleep(0.01 * (rank + 1))  # ranks run at different speeds, as real ones do
        if flag.should_stop():
            result = {"rank": rank, "step": step, "reason": flag.reason}
            (out / f"stopped-{rank}.json").write_text(json.dumps(result))
            flag.close()
            dist.destroy_process_group()
            return 0
    return 3


if __name__ == "__main__":
    sys.exit(main())
