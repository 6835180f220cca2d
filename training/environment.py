"""The launcher's checks of the TRAIN_* environment, before any rank starts.

Each bad value is one sentence naming the variable, the value and what would
work (exit 2), instead of a traceback from every rank tens of seconds later.
The names and their meaning are training.contract.ENV's.
"""

from __future__ import annotations

import errno
import ipaddress
import logging
import os
import re
import socket
import tempfile
import urllib.parse
from dataclasses import replace
from pathlib import Path

from training.checkpoint.s3 import parse_uri
from training.contract import ENV, LAUNCHER_PID_ENV
from training.launcher import Topology, TopologyError

log = logging.getLogger(__name__)

# A DNS host name (RFC 1123 labels); addresses are checked by ipaddress.
_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?"
_HOST_NAME = re.compile(rf"^{_LABEL}(\.{_LABEL})*$")
_WRITABLE_DIRS = ("TRAIN_OUTPUT_DIR", "TRAIN_CHECKPOINT_DIR")


def check_environment(env: dict[str, str]) -> None:
    """Raise TopologyError for the first TRAIN_* value that cannot work; warn on unknown names."""
    for name in sorted(env):
        if name.startswith("TRAIN_") and name not in ENV and name != LAUNCHER_PID_ENV:
            log.warning("%s is not a variable the trainer reads (known: %s)", name, ", ".join(ENV))
    port = env.get("TRAIN_MASTER_PORT")
    if port and not (port.isdigit() and 1 <= int(port) <= 65535):
        raise TopologyError(
            f"TRAIN_MASTER_PORT = {port!r} is not a TCP port: use a number in 1..65535 "
            "(unset, a single node picks a free one)"
        )
    address = env.get("TRAIN_MASTER_ADDR")
    if address and not _is_host(address):
        raise TopologyError(
            f"TRAIN_MASTER_ADDR = {address!r} is not a host name or IP address: give node 0's "
            "address alone (the port goes in TRAIN_MASTER_PORT)"
        )
    if env.get("TRAIN_S3_URI"):
        try:
            parse_uri(env["TRAIN_S3_URI"])
        except ValueError as error:
            raise TopologyError(str(error)) from None
    endpoint = env.get("TRAIN_SPOT_ENDPOINT")
    if endpoint:
        parsed = urllib.parse.urlparse(endpoint)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise TopologyError(
                f"TRAIN_SPOT_ENDPOINT = {endpoint!r} is not an http(s) URL: e.g. "
                "http://169.254.169.254, or empty to turn spot-notice polling off"
            )
    for name in _WRITABLE_DIRS:
        if env.get(name):
            check_writable_dir(name, Path(env[name]))


def _is_host(text: str) -> bool:
    try:
        ipaddress.ip_address(text.strip("[]"))
    except ValueError:
        return _HOST_NAME.match(text) is not None
    return True


def check_writable_dir(name: str, folder: Path) -> None:
    """Raise TopologyError unless this user can create `folder` (or write in it): tried for
    real, in a scratch folder removed at once, since permission bits alone do not tell (a
    read-only mount, /proc, a full disk)."""
    existing = folder.absolute()
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise TopologyError(f"{name} = {str(folder)!r}: {existing} is a file, not a folder")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".write-check-", dir=existing))
    except OSError as error:
        raise TopologyError(
            f"{name} = {str(folder)!r}: {existing} is not writable by this user "
            f"({error.strerror}); choose a folder it can write"
        ) from None


def rendezvous_port(topo: Topology, env: dict[str, str]) -> Topology:
    """The topology with a usable rendezvous port, checked on node 0.

    A single node without TRAIN_MASTER_PORT takes a free port, so that two jobs
    on one machine never collide; several nodes keep the configured (or default)
    port, which every node must agree on. Node 0 binds the port itself, so a port
    already in use is reported here, in one line.
    """
    if topo.nnodes == 1 and not env.get("TRAIN_MASTER_PORT"):
        with socket.socket() as sock:
            sock.bind(("", 0))
            return replace(topo, master_port=sock.getsockname()[1])
    if topo.node_rank == 0:
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(("", topo.master_port))
            except OSError as error:
                if error.errno != errno.EADDRINUSE:
                    raise
                raise TopologyError(
                    f"TRAIN_MASTER_PORT = {topo.master_port} is already in use on this machine "
                    "(another job's rendezvous?): stop that job or set TRAIN_MASTER_PORT to a "
                    "free port on every node"
                ) from None
    return topo
