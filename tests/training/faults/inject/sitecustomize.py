"""A machine dying at an exact moment, for the fault tests.

Python imports ``sitecustomize`` at start-up from the first folder on sys.path
that has one; the fault tests put this folder on PYTHONPATH, and name the fault, with
``tests.training.faults.injection.fault_env``. In the worker of
rank FAULT_RANK (default 0) it counts the calls of FAULT_POINT and, at call
FAULT_AT, SIGKILLs the launcher and then itself (the other ranks die with the
launcher): no handler runs, nothing is flushed, as in a power cut.

    save    after the checkpoint engine wrote a file (the step folder is half written)
    upload  before a file goes to S3 (the S3 copy is half uploaded)
    commit  after an atomic write of the manifest or the pointer (odd: marker only)
    manifest  before an atomic write of the manifest or the pointer (odd: every file of
            the checkpoint written, its manifest not)
    batch   before the trainer takes a batch (with FAULT_ACTION=pause: a data stall)
    window  before the trainer's per-window all-reduce of the loss (a collective; call
            N is step N when every step is logged)
    batches every batch the rank takes sleeps FAULT_SLOW_S first (a slow rank: no
            FAULT_AT, nothing dies)
    writes  every checkpoint file the rank writes takes FAULT_SLOW_S longer (a slow disk:
            no FAULT_AT, nothing dies)

With FAULT_ACTION=pause the worker does not die: it creates the file FAULT_FLAG and
sleeps FAULT_PAUSE_S seconds there instead (a slow save, for a notice to land in).
FAULT_ACTION=hang is a pause without end: the rank hangs there, its peers wait for it
inside the collective.
"""

from __future__ import annotations

import os
import signal

POINT = os.environ.get("FAULT_POINT")


def _act() -> None:
    action = os.environ.get("FAULT_ACTION")
    if action in ("pause", "hang"):
        import pathlib
        import time

        pathlib.Path(os.environ["FAULT_FLAG"]).touch()
        while True:
            time.sleep(float(os.environ.get("FAULT_PAUSE_S", 3600)))
            if action == "pause":
                return
    os.kill(int(os.environ["TRAIN_LAUNCHER_PID"]), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


def _counting(function, *, before: bool):
    at = int(os.environ["FAULT_AT"])
    calls = 0

    def wrapper(*args, **kwargs):
        nonlocal calls
        calls += 1
        if before and calls == at:
            _act()
        result = function(*args, **kwargs)
        if not before and calls == at:
            _act()
        return result

    return wrapper


def _install() -> None:
    if POINT == "save":
        from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import (
            TorchCheckpointEngine,
        )

        TorchCheckpointEngine.save = _counting(TorchCheckpointEngine.save, before=False)
    elif POINT == "upload":
        from training.checkpoint.s3 import S3Mirror

        original_init = S3Mirror.__init__

        def init(self, *args, **kwargs):
            original_init(self, *args, **kwargs)
            self._s3.upload_file = _counting(self._s3.upload_file, before=True)

        S3Mirror.__init__ = init
    elif POINT in ("commit", "manifest"):
        from training.checkpoint import commit

        commit.write_atomically = _counting(commit.write_atomically, before=POINT == "manifest")
    elif POINT == "batch":
        from training import trainer

        batches = trainer.micro_batches

        def stalling(*args, **kwargs):
            take = _counting(lambda: None, before=True)
            for batch in batches(*args, **kwargs):
                take()
                yield batch

        trainer.micro_batches = stalling
    elif POINT == "batches":
        import time

        from training import trainer

        original_batches = trainer.micro_batches

        def slow_batches(*args, **kwargs):
            for batch in original_batches(*args, **kwargs):
                time.sleep(float(os.environ["FAULT_SLOW_S"]))
                yield batch

        trainer.micro_batches = slow_batches
    elif POINT == "writes":
        import time

        from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import (
            TorchCheckpointEngine,
        )

        original_save = TorchCheckpointEngine.save

        def slow_save(*args, **kwargs):
            time.sleep(float(os.environ["FAULT_SLOW_S"]))
            return original_save(*args, **kwargs)

        TorchCheckpointEngine.save = slow_save
    elif POINT == "window":
        from training import trainer

        trainer.mean_over_ranks = _counting(trainer.mean_over_ranks, before=True)


if POINT and "RANK" in os.environ and os.environ["RANK"] == os.environ.get("FAULT_RANK", "0"):
    _install()
