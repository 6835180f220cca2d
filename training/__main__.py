import os
import sys

from training import logs, startup

startup.listen()  # before the imports below, which take seconds
if "RANK" in os.environ:  # a worker; the launcher says what it does once it knows
    logs.divert_library_warnings()
    startup.begin("imports", "torch, DeepSpeed and the trainer")

from common.pipes import run_until_pipe_closes  # noqa: E402
from training.cli import main  # noqa: E402

sys.exit(run_until_pipe_closes(main))
