import sys

from training import startup

startup.listen()  # before the imports below, which take seconds
startup.hold_collection()

from common.pipes import run_until_pipe_closes  # noqa: E402
from training.cli import main  # noqa: E402

startup.release_collection()

sys.exit(run_until_pipe_closes(main))
