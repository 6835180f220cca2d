"""Settings for every test process and every job a test starts."""

from __future__ import annotations

import os
import sys
from pathlib import Path

# DeepSpeed JIT-builds ops (shm_comm on CPU) into TORCH_EXTENSIONS_DIR, default
# ~/.cache/torch_extensions, shared by every venv on the machine. A build killed midway
# leaves torch's lock file there, and every later job waits on it forever. A cache of the
# venv's own keeps the suite apart from anything else on the machine (bench/launch.py too).
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path(sys.prefix) / "torch_extensions"))

# Fixtures every test folder may use (pytest reads this only in the root conftest).
pytest_plugins = ["tests.support.aws", "tests.support.ci_log", "tests.support.suite_time"]
