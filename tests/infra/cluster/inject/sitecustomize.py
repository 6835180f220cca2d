"""Faults a node brings to a job, for the drain tests (tests/infra/cluster/test_node_drain.py).

Python imports ``sitecustomize`` at start-up from the first folder on sys.path that has
one; the test puts this folder on PYTHONPATH.

- GATE_FAIL_ONCE=FILE: the first `python -m training health` to start on any node writes
  that node's name (SLURMD_NODENAME) to FILE and expects one EFA device there, which this
  machine does not have: the gate's real EFA check fails on that node. Every later gate,
  on any node, runs unchanged.
- LOOPBACK_METADATA=URL: the trainer polls its own node's metadata service for a spot
  notice, URL/<node> (tests/support/slurm.py, MetadataService), as it polls EC2's on a node.
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

metadata = os.environ.get("LOOPBACK_METADATA")
if metadata and "SLURMD_NODENAME" in os.environ:
    os.environ["TRAIN_SPOT_ENDPOINT"] = f"{metadata}/{os.environ['SLURMD_NODENAME']}"
