"""`python -m training`: the launcher without RANK in the environment, a worker with it.

    python -m training [--config FILE.toml] [--set key=value ...] [--fresh] [--print-ds-config]
    python -m training export CHECKPOINT out.pt
    python -m training estimate [--config FILE.toml] [--gpus N] [--gpu-type V100-16GB]
    python -m training health      (this node's health gate: GPUs, memory errors, all-reduce, EFA)

Exit codes: 0 done, 1 failed, 2 bad configuration (nothing started),
75 interrupted and checkpointed (run the same command again to resume),
69 this node failed its health gate.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from typing import NoReturn

import torch

from training import logs, startup
from training.checkpoint.resume_check import check_resumable
from training.code import use_job_code
from training.components import preflight
from training.contract import ExitCode
from training.ds_config import build_ds_config
from training.environment import check_environment, rendezvous_port
from training.fresh import move_aside
from training.launcher import (
    TopologyError,
    die_with_launcher,
    launch,
    stopped_before_training,
    topology_from_env,
)
from training.machine import gpu_capability, installed_driver
from training.metrics import usd_per_hour
from training.oom import OutOfMemory
from training.spec.config import BatchSizes, Config, ConfigError, load_config, validate
from training.spec.selfcheck import SelfCheckError, check_driver, check_precision

log = logging.getLogger("training")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m training",
        description="Train with DeepSpeed. Without --config (or TRAIN_CONFIG) runs the demo job.",
        epilog="Export weights: python -m training export CHECKPOINT out.pt; GPU memory "
        "before renting: python -m training estimate --config FILE --gpus N --gpu-type T",
    )
    p.add_argument("--config", help="TOML config file (default: TRAIN_CONFIG, else the demo job)")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one config key, e.g. --set train.steps=100 (repeatable)",
    )
    p.add_argument(
        "--fresh",
        action="store_true",
        help="start from step 0: move the run folder (and checkpoints) aside to "
        "NAME.<timestamp> instead of resuming; nothing is deleted",
    )
    p.add_argument(
        "--print-ds-config",
        action="store_true",
        help="print the DeepSpeed JSON this config gives on this machine and exit",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["export"]:
        from training.checkpoint.export import main as export_main

        return export_main(argv[1:])
    if argv[:1] == ["estimate"]:
        from training.estimate import main as estimate_main

        return estimate_main(argv[1:])
    if argv[:1] == ["health"]:
        from training.health.gate import main as health_main

        return health_main(argv[1:])
    args = parser().parse_args(argv)
    if "RANK" in os.environ:
        return _worker(args)
    return _launcher(args, argv)


def _load(args: argparse.Namespace, world_size: int) -> tuple[Config, BatchSizes]:
    config = load_config(args.config or os.environ.get("TRAIN_CONFIG"), args.overrides)
    return config, validate(config, world_size)


def _launcher(args: argparse.Namespace, argv: list[str]) -> int:
    _configure_logging(rank=None)
    try:
        check_environment(os.environ)
        topo = topology_from_env(os.environ)
        use_job_code(os.environ)  # before the builders import: they may live in it
        config, batch = _load(args, topo.world_size)
        preflight(config)
        check_driver(os.environ.get("TRAIN_MIN_DRIVER"), installed_driver())
        check_precision(
            bf16=config.precision.bf16,
            fp16=config.precision.fp16,
            on_gpu=torch.cuda.is_available(),
            capability=gpu_capability(),
        )
        usd_per_hour(os.environ)  # a bad price stops the job here, before any rank starts
    except (ConfigError, TopologyError, SelfCheckError) as error:
        print(f"error: {error}", file=sys.stderr)
        return ExitCode.BAD_CONFIG
    if args.print_ds_config:
        on_gpu = torch.cuda.is_available()
        print(json.dumps(build_ds_config(config, batch, on_gpu=on_gpu), indent=2))
        return 0
    try:
        topo = rendezvous_port(topo, os.environ)
    except TopologyError as error:
        print(f"error: {error}", file=sys.stderr)
        return ExitCode.BAD_CONFIG
    if args.fresh:
        try:
            moved = move_aside(config, os.environ)
        except ConfigError as error:
            print(f"error: {error}", file=sys.stderr)
            return ExitCode.BAD_CONFIG
        for old, new in moved:
            log.info("--fresh: moved %s aside to %s", old, new)
    try:
        check_resumable(config)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return ExitCode.BAD_CONFIG
    if startup.stop_requested():
        return stopped_before_training(startup.stop_requested())
    startup.begin(
        "launch",
        f"starting {topo.nproc_per_node} worker(s) on node {topo.node_rank} of {topo.nnodes} "
        f"(world size {topo.world_size}), output in {config.output_dir}",
    )
    return launch(topo, argv, config.watchdog)


def _worker(args: argparse.Namespace) -> NoReturn:
    from training.checkpoint.checkpointer import CheckpointError
    from training.interrupt import StopFlag, spot_endpoint_from_env
    from training.trainer import Placement, Trainer
    from training.watchdog import install_stack_dump

    startup.watch_op_builds()
    die_with_launcher()
    placement = Placement.from_env()
    install_stack_dump(os.environ, placement.rank)
    where = _configure_logging(rank=placement.rank)
    # Listening from here on; a request that came during start-up is handed over.
    stop = StopFlag(spot_endpoint=spot_endpoint_from_env(os.environ))
    stop.start()
    if startup.stop_requested():
        stop.request_stop(startup.stop_requested())
    try:
        config, _ = _load(args, placement.world_size)
        logs.write_to(config.output_dir / "logs" / f"rank{placement.rank}.log", where)
        code = Trainer(config, placement, stop=stop).run()
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        code = ExitCode.BAD_CONFIG
    except CheckpointError as error:  # says what happened and what to do: no traceback
        log.error("rank %d: %s", placement.rank, error)
        code = ExitCode.FAILED
    except OutOfMemory as error:
        print(f"error: {error}", file=sys.stderr)
        code = error.exit_code
    except Exception:
        log.exception("rank %d failed", placement.rank)
        code = ExitCode.FAILED
    # Interpreter shutdown spends seconds in native finalizers (communication backends)
    # with nothing left to do: checkpoints are fsynced and metrics closed by now. Exit
    # directly, so that the job's end (and a spot stop's deadline) is not spent there.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _configure_logging(rank: int | None) -> str:
    """Log lines to stderr, a library's below ERROR to the log file only; returns the
    name lines carry ("launcher", "rank 0")."""
    where = "launcher" if rank is None else f"rank {rank}"
    logging.basicConfig(
        level=logging.INFO if rank in (None, 0) else logging.WARNING,
        format=logs.FORMAT.format(where=where),
        datefmt="%H:%M:%S",
    )
    for handler in logging.getLogger().handlers:
        handler.addFilter(logs.console_filter)
    # DeepSpeed prints its whole config at INFO on every rank; warnings are enough.
    logging.getLogger(logs.DEEPSPEED_LOGGER).setLevel(logging.WARNING)
    return where
