"""The trainer's environment (training.contract.ENV), read once, parsed and checked.

`read_environment()` is the one place the trainer reads its process environment; the
launcher and each worker call it at start and pass the `TrainerEnv` down. Each bad
value is one sentence naming the variable, the value and what would work (exit 2),
instead of a traceback from every rank tens of seconds later. Torch-free: the worker
reads it before its heavy imports.
"""

from __future__ import annotations

import ipaddress
import logging
import math
import os
import re
import shutil
import socket
import tempfile
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from common.errors import ConfigError
from training.contract import ENV, HEARTBEAT_DIR_ENV, LAUNCHER_PID_ENV, PREPARED_DATA_ENV
from training.health.expectation import ExpectationError, NodeExpectation
from training.spec.config import ENV_OVERRIDES

log = logging.getLogger(__name__)

# A DNS host name (RFC 1123 labels); addresses are checked by ipaddress.
_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?"
_HOST_NAME = re.compile(rf"^{_LABEL}(\.{_LABEL})*$")
_WRITABLE_DIRS = ("TRAIN_OUTPUT_DIR", "TRAIN_CHECKPOINT_DIR")


class TopologyError(ConfigError):
    """A TRAIN_* variable with a value that cannot work."""


@dataclass(frozen=True)
class TrainerEnv:
    """What the environment tells the trainer; defaults are an unset variable's meaning."""

    config: str | None = None  # TRAIN_CONFIG
    nnodes: int = 1
    node_rank: int = 0
    nproc_per_node: int | None = None  # unset: one per GPU (the launcher decides)
    master_addr: str = "127.0.0.1"
    master_port: int | None = None  # unset: the default, or a free one on a single node
    # TRAIN_OUTPUT_DIR, TRAIN_CHECKPOINT_DIR, TRAIN_DATA_PATH as set: the config's overrides.
    config_paths: Mapping[str, str] = field(default_factory=dict)
    s3_uri: str | None = None
    spot_endpoint: str | None = None  # unset: None; set empty: polling turned off
    min_driver: str | None = None
    usd_per_hour: float | None = None
    code_uri: str | None = None  # TRAIN_CODE_URI: the job's own code (training/code.py)
    # TRAIN_CACHE_DIR: tokenized data and models copied from S3, on the node's local disk.
    cache_dir: Path = field(default_factory=lambda: _default_cache_dir({}))
    # Where DeepSpeed's JIT-compiled ops are cached: TORCH_EXTENSIONS_DIR, else
    # torch_extensions in the user's cache folder (torch/utils/cpp_extension.py,
    # get_default_build_root, through torch._appdirs.user_cache_dir).
    op_cache_dir: Path = field(default_factory=lambda: _op_cache_dir({}))
    # PYTHONPATH as inherited: the job's code goes before it, for the launcher's ranks too.
    python_path: str | None = None
    # DeepSpeed's op build settings: DS_ACCELERATOR, CXX, CUDA_HOME (training/spec/ops.py).
    op_build: Mapping[str, str] = field(default_factory=dict)
    expect: NodeExpectation = field(default_factory=NodeExpectation)
    # Set for each worker: by the launcher, and by torch's elastic launcher
    # (torch.distributed.run); `rank` None means this process is the launcher.
    launcher_pid: int | None = None
    heartbeat_dir: Path | None = None
    prepared_data: Path | None = None  # the tokenized data the launcher prepared
    rank: int | None = None
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    # Slurm names its node in each task's environment (srun(1), SLURMD_NODENAME).
    slurm_node_name: str | None = None
    unknown: tuple[str, ...] = ()  # TRAIN_* names the trainer does not read: a typo?

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> TrainerEnv:
        """Parse and check every variable; TopologyError names the first bad one."""
        env = cls(
            unknown=tuple(
                name
                for name in sorted(environ)
                if name.startswith("TRAIN_") and name not in ENV and name not in _SET_BY_LAUNCHER
            ),
            config=environ.get("TRAIN_CONFIG") or None,
            nnodes=_integer(environ, "TRAIN_NNODES", 1),
            node_rank=_integer(environ, "TRAIN_NODE_RANK", 0),
            nproc_per_node=_integer(environ, "TRAIN_NPROC_PER_NODE", None),
            master_addr=_host(environ.get("TRAIN_MASTER_ADDR")),
            master_port=_port(environ.get("TRAIN_MASTER_PORT")),
            config_paths={name: environ[name] for name in ENV_OVERRIDES if environ.get(name)},
            s3_uri=_s3_uri(environ.get("TRAIN_S3_URI")),
            spot_endpoint=_spot_endpoint(environ.get("TRAIN_SPOT_ENDPOINT")),
            min_driver=environ.get("TRAIN_MIN_DRIVER") or None,
            usd_per_hour=_price(environ.get("TRAIN_USD_PER_HOUR", "")),
            code_uri=environ.get("TRAIN_CODE_URI", "").strip() or None,
            cache_dir=_default_cache_dir(environ),
            op_cache_dir=_op_cache_dir(environ),
            python_path=environ.get("PYTHONPATH") or None,
            op_build={name: environ[name] for name in OP_BUILD_ENV if environ.get(name)},
            expect=_expectation(environ),
            launcher_pid=_integer(environ, LAUNCHER_PID_ENV, None),
            heartbeat_dir=Path(environ[HEARTBEAT_DIR_ENV])
            if environ.get(HEARTBEAT_DIR_ENV)
            else None,
            prepared_data=Path(environ[PREPARED_DATA_ENV])
            if environ.get(PREPARED_DATA_ENV)
            else None,
            rank=_integer(environ, "RANK", None),
            local_rank=_integer(environ, "LOCAL_RANK", 0),
            world_size=_integer(environ, "WORLD_SIZE", 1),
            local_world_size=_integer(environ, "LOCAL_WORLD_SIZE", 1),
            slurm_node_name=environ.get("SLURMD_NODENAME") or None,
        )
        for name, value, what, unset in (
            ("TRAIN_NNODES", env.nnodes, "nodes in the job", "1"),
            ("TRAIN_NPROC_PER_NODE", env.nproc_per_node, "workers on this node", "one per GPU"),
        ):
            if value is not None and value < 1:
                raise TopologyError(
                    f"{name} = {value}: give the {what}, at least 1 (unset: {unset})"
                )
        if not 0 <= env.node_rank < env.nnodes:
            raise TopologyError(
                f"TRAIN_NODE_RANK = {env.node_rank} is outside 0..{env.nnodes - 1} "
                f"(TRAIN_NNODES = {env.nnodes})"
            )
        return env

    def warn_unknown(self) -> None:
        """Log each TRAIN_* name the trainer does not read (the launcher does, once)."""
        for name in self.unknown:
            log.warning("%s is not a variable the trainer reads (known: %s)", name, ", ".join(ENV))

    @property
    def node_name(self) -> str:
        """The node as Slurm names it (what `scontrol update NodeName=` takes), else the host."""
        return self.slurm_node_name or socket.gethostname()


# What decides which DeepSpeed ops this run can use or build (training/spec/ops.py).
OP_BUILD_ENV = ("DS_ACCELERATOR", "CXX", "CUDA_HOME")

# Set by the launcher for its workers, not by users.
_SET_BY_LAUNCHER = (LAUNCHER_PID_ENV, HEARTBEAT_DIR_ENV, PREPARED_DATA_ENV)


def _default_cache_dir(environ: Mapping[str, str]) -> Path:
    """TRAIN_CACHE_DIR, else the user's cache folder (XDG_CACHE_HOME, ~/.cache)/training."""
    if environ.get("TRAIN_CACHE_DIR"):
        return Path(environ["TRAIN_CACHE_DIR"])
    return Path(environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "training"


def _op_cache_dir(environ: Mapping[str, str]) -> Path:
    if environ.get("TORCH_EXTENSIONS_DIR"):
        return Path(environ["TORCH_EXTENSIONS_DIR"])
    home = Path(environ["HOME"]) if environ.get("HOME") else Path.home()
    return Path(environ.get("XDG_CACHE_HOME") or home / ".cache") / "torch_extensions"


def read_environment() -> TrainerEnv:
    """This process's environment: the one read of os.environ in the trainer."""
    return TrainerEnv.from_environ(os.environ)


def inherited_environment() -> dict[str, str]:
    """The whole environment, for a command the trainer starts as a job (training/command_job.py):
    the user's command reads whatever it reads, as it would without the trainer around it."""
    return dict(os.environ)


def _integer(environ: Mapping[str, str], name: str, default: int | None) -> int | None:
    text = environ.get(name)
    if not text:
        return default
    try:
        return int(text)
    except ValueError:
        raise TopologyError(f"{name} = {text!r} is not an integer") from None


def _port(text: str | None) -> int | None:
    if not text:
        return None
    if not (text.isdigit() and 1 <= int(text) <= 65535):
        raise TopologyError(
            f"TRAIN_MASTER_PORT = {text!r} is not a TCP port: use a number in 1..65535 "
            "(unset, a single node picks a free one)"
        )
    return int(text)


def _host(text: str | None) -> str:
    if not text:
        return "127.0.0.1"
    try:
        ipaddress.ip_address(text.strip("[]"))
    except ValueError:
        if _HOST_NAME.match(text) is None:
            raise TopologyError(
                f"TRAIN_MASTER_ADDR = {text!r} is not a host name or IP address: give node 0's "
                "address alone (the port goes in TRAIN_MASTER_PORT)"
            ) from None
    return text


def _s3_uri(text: str | None) -> str | None:
    if not text:
        return None
    from training.checkpoint.s3 import parse_uri  # boto3: only when a mirror is set

    try:
        parse_uri(text)
    except ValueError as error:
        raise TopologyError(str(error)) from None
    return text


def _spot_endpoint(text: str | None) -> str | None:
    if text:
        parsed = urllib.parse.urlparse(text)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise TopologyError(
                f"TRAIN_SPOT_ENDPOINT = {text!r} is not an http(s) URL: e.g. "
                "http://169.254.169.254, or empty to turn spot-notice polling off"
            )
    return text


def _price(text: str) -> float | None:
    """The job's price per hour, all nodes together (set by the stack)."""
    if not text.strip():
        return None
    try:
        price = float(text)
    except ValueError:
        price = math.nan
    if not math.isfinite(price) or price < 0:
        raise TopologyError(
            f"TRAIN_USD_PER_HOUR={text.strip()!r} is not a price: give USD per hour for the "
            "whole job, e.g. 32.77, or leave it unset"
        )
    return price


def _expectation(environ: Mapping[str, str]) -> NodeExpectation:
    try:
        return NodeExpectation.from_env(environ)
    except ExpectationError as error:
        raise TopologyError(str(error)) from None


def check_writable_dirs(env: TrainerEnv) -> None:
    """Raise TopologyError unless this user can write TRAIN_OUTPUT_DIR and TRAIN_CHECKPOINT_DIR."""
    for name in _WRITABLE_DIRS:
        if env.config_paths.get(name):
            check_writable_dir(name, Path(env.config_paths[name]))


# Room a job needs on its output disk before it starts: logs, metrics and the first
# checkpoint's temporary files (the checkpointer checks each save's own size later).
MIN_FREE_BYTES = 100 * 2**20


def check_job_folders(output_dir: Path, checkpoint_dir: Path, op_cache_dir: Path) -> None:
    """Refuse, in one line before any worker starts, a job whose folders cannot be written
    or whose output disk is full, and a HOME where DeepSpeed's compiled ops cannot be
    cached (each rank would crash there with a traceback)."""
    for name, folder in (
        ("the run's output folder (run.output_dir, TRAIN_OUTPUT_DIR)", output_dir),
        ("the checkpoint folder (checkpoint.dir, TRAIN_CHECKPOINT_DIR)", checkpoint_dir),
        ("the compiled-op cache (HOME, XDG_CACHE_HOME or TORCH_EXTENSIONS_DIR)", op_cache_dir),
    ):
        check_writable_dir(name, folder)
    for name, folder in (("output", output_dir), ("checkpoint", checkpoint_dir)):
        free = shutil.disk_usage(_existing(folder)).free
        if free < MIN_FREE_BYTES:
            raise TopologyError(
                f"the {name} folder {str(folder)!r} is on a full disk ({free // 2**20} MiB "
                f"free, a job needs {MIN_FREE_BYTES // 2**20} MiB to start): free some space, "
                "or point TRAIN_OUTPUT_DIR and TRAIN_CHECKPOINT_DIR at a disk with room"
            )


def _existing(folder: Path) -> Path:
    existing = folder.absolute()
    while not existing.exists():
        existing = existing.parent
    return existing


def check_writable_dir(name: str, folder: Path) -> None:
    """Raise TopologyError unless this user can create `folder` (or write in it): tried for
    real, in a scratch folder removed at once, since permission bits alone do not tell (a
    read-only mount, /proc, a full disk)."""
    existing = _existing(folder)
    if not existing.is_dir():
        raise TopologyError(f"{name} = {str(folder)!r}: {existing} is a file, not a folder")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".write-check-", dir=existing))
    except OSError as error:
        raise TopologyError(
            f"{name} = {str(folder)!r}: {existing} is not writable by this user "
            f"({error.strerror}); choose a folder it can write"
        ) from None
