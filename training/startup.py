"""Stop requests that arrive before anything else listens for them.

`python -m training` installs these handlers first, before torch is imported,
so that a SIGTERM or SIGINT during the seconds of start-up is remembered
instead of killing the process with -15: the launcher then exits 75 before
starting workers, and a worker hands the request to its StopFlag.
Torch-free on purpose: it must be importable in milliseconds.
"""

from __future__ import annotations

import signal

_received: list[str] = []


def listen() -> None:
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _remember)


def stop_requested() -> str | None:
    """The name of the first stop signal received since listen(), or None."""
    return _received[0] if _received else None


def _remember(signum: int, _frame) -> None:
    _received.append(signal.Signals(signum).name)
