"""The two ways an images command stops, and the exit code each gives.

Bad input or a missing tool is caught before anything runs (exit 2, like argparse);
a build tool that ran and failed has already printed its own output (exit 1).
"""

from __future__ import annotations


class CannotRun(RuntimeError):
    """The command cannot run here: a bad option or variant, or a tool not on PATH."""


class RunFailed(RuntimeError):
    """A build tool ran and failed; its output is above."""
