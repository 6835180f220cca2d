"""A node whose health gate fails, once: for the drain test (tests/infra/cluster).

Python imports ``sitecustomize`` at start-up from the first folder on sys.path that has
one; the test puts this folder on PYTHONPATH. The first `python -m training health` to
start on any node writes that node's name (SLURMD_NODENAME) to GATE_FAIL_ONCE and expects
one EFA device there, which this machine does not have: the gate's real EFA check fails
on that node. Every later gate, on any node, runs unchanged.
"""

from __future__ import annotations

import os
from pathlib import Path


def _arguments() -> list[str]:
    return Path("/proc/self/cmdline").read_bytes().decode().split("\0")


marker = os.environ.get("GATE_FAIL_ONCE")
if marker and "health" in _arguments():
    try:
        with open(marker, "x") as claimed:  # only the first gate wins
            claimed.write(os.environ["SLURMD_NODENAME"])
    except FileExistsError:
        pass
    else:
        os.environ["TRAIN_EXPECT_EFA"] = "1"
