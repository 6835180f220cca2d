"""One launcher per run folder at a time.

Two launchers on one run would race for its checkpoints: the second loads a checkpoint the
first is about to prune, both write metrics and the same step folders. So the launcher
holds an exclusive lock on a file in the run folder and one in the checkpoint folder for as
long as it runs, and a second start is refused in one line (exit
2) before any rank starts.

The lock is flock(2) (https://man7.org/linux/man-pages/man2/flock.2.html): the kernel
drops it when the last descriptor of its open file is closed, so a launcher that dies in
any way (kill -9, out of memory, the machine gone) leaves no lock behind, and there is no
stale-lock rule to get wrong. The workers do not inherit the descriptor (torch's elastic
agent starts them with close_fds). Each node's launcher of a job locks a file of its own
(named by its node rank): the nodes of one job may share the folder. On NFS, Linux takes
flock as a POSIX lock on the server, so launchers on two machines exclude each other too.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import socket
import time
from pathlib import Path
from typing import IO

from training.spec.config import Config, ConfigError

log = logging.getLogger(__name__)


class RunFolderBusy(ConfigError):
    """Another launcher holds the run folder."""


def run_folders(config: Config) -> list[Path]:
    """The folders a run writes: its run folder and its checkpoint folder, each locked (a
    second run may name the first's checkpoint folder from a run folder of its own)."""
    folders = [config.output_dir, config.checkpoint_dir]
    return folders[:1] if folders[0].resolve() == folders[1].resolve() else folders


class RunFolderLock:
    """The locks of one launcher (node ``node_rank`` of its job) on its run's folders."""

    def __init__(self, node_rank: int):
        self.name = f".launcher-node{node_rank}.lock"
        self._held: list[IO[str]] = []

    def acquire(self, folders: list[Path], *, create: bool = True) -> None:
        """Lock ``folders`` (created if need be; without ``create``, those that exist)
        instead of whatever was held; RunFolderBusy, holding nothing, when another launcher
        holds one of them."""
        self.release()
        for folder in folders:
            if not create and not folder.is_dir():
                continue
            folder.mkdir(parents=True, exist_ok=True)
            handle = open(folder / self.name, "a+")  # noqa: SIM115 - held until release
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.seek(0)
                holder = handle.read().strip() or "its process id not written yet"
                handle.close()
                self.release()
                raise RunFolderBusy(
                    f"{folder} is in use by another launcher ({holder}): a run takes one "
                    "launcher at a time; wait for that one to end (or stop it), or give this "
                    "run its own run.name (a run folder of its own)"
                ) from None
            except OSError as error:
                if error.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL):
                    raise
                # A filesystem without locks (some network mounts): run unguarded, said once.
                handle.close()
                log.warning(
                    "cannot lock %s (%s): nothing stops a second launcher on this run",
                    folder,
                    os.strerror(error.errno),
                )
                continue
            handle.seek(0)
            handle.truncate()
            since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            handle.write(f"pid {os.getpid()} on {socket.gethostname()}, since {since}\n")
            handle.flush()
            self._held.append(handle)

    def release(self) -> None:
        for handle in self._held:
            with contextlib.suppress(OSError):
                handle.close()  # closing the last descriptor drops the lock
        self._held = []
