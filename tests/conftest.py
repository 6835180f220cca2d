"""Settings for every test process and every job a test starts."""

from __future__ import annotations

import gc
import os
import sys
from pathlib import Path

# DeepSpeed JIT-builds ops (shm_comm on CPU) into TORCH_EXTENSIONS_DIR, default
# ~/.cache/torch_extensions, shared by every venv on the machine. A build killed midway
# leaves torch's lock file there, and every later job waits on it forever. A cache of the
# venv's own keeps the suite apart from anything else on the machine (bench/launch.py too).
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path(sys.prefix) / "torch_extensions"))

# A test process holds torch, DeepSpeed, Pulumi and moto: millions of objects, and each full
# collection walks them all (0.4 to 0.9 s here). CPython's default thresholds (700, 10, 10)
# promote short-lived objects fast enough to run about 30 full collections a worker in
# `make test-fast`: GC took some 75 of its 330 CPU-seconds (timed with gc.callbacks). Young
# collections every 20,000 allocations leave most of those objects to die young: 2 to 6
# full collections a worker, and about 30 CPU-seconds of GC in all.
gc.set_threshold(20_000, 50, 1000)

# Fixtures every test folder may use (pytest reads this only in the root conftest).
pytest_plugins = ["tests.support.aws", "tests.support.ci_log", "tests.support.suite_time"]
