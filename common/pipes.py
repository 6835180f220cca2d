"""Both command lines' output may go into a pipe that closes early (`... | head`).

Python raises BrokenPipeError on the next write to it, and again at exit when it flushes
stdout; the Python docs' recipe ("Note on SIGPIPE", https://docs.python.org/3/library/
signal.html#note-on-sigpipe) points stdout at /dev/null so the exit stays quiet. The exit
status is a shell's for a process ended by SIGPIPE (128 + 13), as `head` users expect.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from collections.abc import Callable

CLOSED_PIPE_EXIT = 128 + signal.SIGPIPE


def run_until_pipe_closes(main: Callable[[], int]) -> int:
    """main()'s exit status; CLOSED_PIPE_EXIT, without a traceback, when stdout's reader
    went away."""
    # A log line to the closed pipe (DeepSpeed logs to stdout) would print logging's own
    # traceback; the logging docs advise raiseExceptions = False outside development.
    logging.raiseExceptions = False
    try:
        status = main()
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's exit
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return CLOSED_PIPE_EXIT
    return status
