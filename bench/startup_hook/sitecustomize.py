"""Start-up timestamps of a `python -m training` worker, for bench/startup.py.

On PYTHONPATH, Python imports this module at interpreter start in every process of the
job. In a worker (RANK set) with BENCH_STARTUP_DIR set, it imports what the trainer
imports (timed) and wraps the calls that make up start-up, recording when each begins
and ends; at the end of the first training step it writes <dir>/rank<N>.json. Nothing
runs per step after that, and the trainer's code is unchanged.
"""

import os

if "RANK" in os.environ and os.environ.get("BENCH_STARTUP_DIR"):
    import json
    import time
    from pathlib import Path

    import psutil

    _marks = {"process_start": psutil.Process().create_time(), "interpreter_ready": time.time()}

    import deepspeed
    import deepspeed.ops.op_builder.builder as _builder
    import torch  # noqa: F401

    import training.trainer  # noqa: F401 (its imports: what a worker loads)
    from training.checkpoint.checkpointer import Checkpointer

    _marks["imports_done"] = time.time()
    _ops: list[tuple[float, float]] = []

    def _timed(owner, name: str, mark: str | None, spans: list | None = None):
        original = getattr(owner, name)

        def wrapper(*args, **kwargs):
            begun = time.time()
            try:
                return original(*args, **kwargs)
            finally:
                if spans is not None:
                    spans.append((begun, time.time(), getattr(args[0], "name", "?")))
                elif f"{mark}_start" not in _marks:
                    _marks[f"{mark}_start"], _marks[f"{mark}_end"] = begun, time.time()

        setattr(owner, name, wrapper)

    _timed(deepspeed, "init_distributed", "rendezvous")
    _timed(deepspeed, "initialize", "engine_build")
    _timed(Checkpointer, "resume", "checkpoint_load")
    _timed(_builder.OpBuilder, "jit_load", None, _ops)
    _step = deepspeed.DeepSpeedEngine.step

    def _first_step(self, *args, **kwargs):
        result = _step(self, *args, **kwargs)
        deepspeed.DeepSpeedEngine.step = _step  # once only: nothing stays in the hot path
        _marks["first_step_end"] = time.time()
        _marks["op_builds"] = _ops
        folder = Path(os.environ["BENCH_STARTUP_DIR"])
        (folder / f"rank{os.environ['RANK']}.json").write_text(json.dumps(_marks))
        return result

    deepspeed.DeepSpeedEngine.step = _first_step
