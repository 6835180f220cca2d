"""`python -m training`: the user's command; training starts the launcher (its workers run
`python -m training.worker`, training/worker.py).

    python -m training [--config FILE.toml] [--set key=value ...] [--fresh] [--print-ds-config]
    python -m training export CHECKPOINT out.pt|OUT_DIR
    python -m training estimate [--config FILE.toml] [--gpus N] [--gpu-type V100-16GB]
    python -m training prepare [--config FILE.toml]   (tokenize a text job's data into the cache)
    python -m training health      (this node's health gate: GPUs, memory errors, all-reduce, EFA)
    python -m training fabric [--size-mib N]   (on every node at once: NCCL's network and
                                   bandwidth between the nodes)

Exit codes: 0 done, 1 failed, 2 bad configuration (nothing started),
75 interrupted and checkpointed (run the same command again to resume),
69 this node failed its health gate.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import sys

import torch

from training import logs, startup
from training.checkpoint.resume_check import check_resumable
from training.checkpoint.s3 import S3Mirror
from training.code import use_job_code
from training.components import preflight
from training.contract import ERROR_PREFIX, FAILURE_PREFIX, PREPARED_DATA_ENV, ExitCode
from training.ds_config import build_ds_config
from training.environment import (
    TopologyError,
    TrainerEnv,
    check_job_folders,
    check_writable_dirs,
    read_environment,
)
from training.fresh import move_aside
from training.inputs import gather
from training.launcher import launch, rendezvous_port, stopped_before_training, topology_from_env
from training.machine import gpu_capability, installed_driver
from training.run_lock import RunFolderLock, run_folders
from training.spec.config import (
    BatchSizes,
    Config,
    ConfigError,
    add_overrides_argument,
    load_config,
    validate,
)
from training.spec.ops import accelerator, can_compile, check_ops, installed_ops, ops_needed
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
    add_overrides_argument(p)
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
    if argv[:1] == ["exec"]:
        from training.command_job import main as exec_main

        return exec_main(argv[1:])
    if argv[:1] == ["export"]:
        from training.checkpoint.export import main as export_main

        return export_main(argv[1:])
    try:
        env = read_environment()
    except TopologyError as error:
        print(f"{ERROR_PREFIX}{error}", file=sys.stderr)
        return ExitCode.BAD_CONFIG
    if argv[:1] == ["estimate"]:
        from training.estimate import main as estimate_main

        return estimate_main(argv[1:], env)
    if argv[:1] == ["health"]:
        from training.health.gate import main as health_main

        return health_main(argv[1:], env.expect, env.min_driver)
    if argv[:1] == ["fabric"]:
        from training.fabric import main as fabric_main

        return fabric_main(argv[1:], env)
    if argv[:1] == ["prepare"]:
        return _prepare(argv[1:], env)
    args = parser().parse_args(argv)
    try:
        return _launcher(args, argv, env)
    except BrokenPipeError:  # stdout's reader left (`| head`): common/pipes.py ends quietly
        raise
    except Exception as error:
        # The launcher's own crash (S3 out of reach for the job's code, a bug): its traceback,
        # then the one line that says why, as for a failed worker (training/launcher.py).
        log.exception("the launcher failed")
        print(f"{FAILURE_PREFIX}launcher: {type(error).__name__}: {error}", file=sys.stderr)
        return ExitCode.FAILED


def _prepare(argv: list[str], env: TrainerEnv) -> int:
    """Fetch a model.hf job's model and tokenize its text into the cache, as training would."""
    from training.text.prepare import parser as prepare_parser

    configure_logging(rank=None)
    args = prepare_parser().parse_args(argv)
    try:
        topo = topology_from_env(env)
        config, _ = load(args, env, topo.world_size, topo.nproc_per_node)
        if not config.is_text:
            raise ConfigError(
                f"data.kind = {config.data.kind!r}: prepare tokenizes text "
                "(jsonl, parquet, text-files, hf-dataset) for a model.hf model"
            )
        files = gather(config, env, world_size=topo.world_size)
    except ConfigError as error:
        print(f"{ERROR_PREFIX}{error}", file=sys.stderr)
        return ExitCode.BAD_CONFIG
    print(f"prepared: {files.data_folder or 'nothing (the train split streams)'}")
    return ExitCode.DONE


def load(
    args: argparse.Namespace, env: TrainerEnv, world_size: int, gpus_per_node: int | None = None
) -> tuple[Config, BatchSizes]:
    """The job's config (--config, else TRAIN_CONFIG, else the demo), checked for world_size
    ranks, ``gpus_per_node`` of them per node."""
    config = load_config(args.config or env.config, args.overrides, env.config_paths)
    return config, validate(config, world_size, gpus_per_node)


def _launcher(args: argparse.Namespace, argv: list[str], env: TrainerEnv) -> int:
    configure_logging(rank=None)
    env.warn_unknown()
    try:
        check_writable_dirs(env)
        topo = topology_from_env(env)
        use_job_code(env)  # before the builders import: they may live in it
        config, batch = load(args, env, topo.world_size, topo.nproc_per_node)
        preflight(config)  # its own words for a checkpoint folder nobody can create
        check_job_folders(config.output_dir, config.checkpoint_dir, env.op_cache_dir)
        check_driver(env.min_driver, installed_driver())
        check_precision(
            bf16=config.precision.bf16,
            fp16=config.precision.fp16,
            on_gpu=torch.cuda.is_available(),
            capability=gpu_capability(),
        )
        on_gpu = torch.cuda.is_available()
        built = installed_ops(accelerator(env.op_build, on_gpu=on_gpu))
        buildable = functools.partial(can_compile, environ=env.op_build)
        check_ops(ops_needed(config, on_gpu=on_gpu), built, buildable)
    except (ConfigError, SelfCheckError) as error:  # TopologyError is a ConfigError
        print(f"{ERROR_PREFIX}{error}", file=sys.stderr)
        return ExitCode.BAD_CONFIG
    if args.print_ds_config:
        on_gpu = torch.cuda.is_available()
        print(json.dumps(build_ds_config(config, batch, on_gpu=on_gpu), indent=2))
        return 0
    lock = RunFolderLock(topo.node_rank)
    try:
        # Before anything reads the run's folders, or --fresh moves them (only those that
        # exist: it creates no folder just to move it aside).
        lock.acquire(run_folders(config), create=not args.fresh)
        topo = rendezvous_port(topo, env)
        if args.fresh:
            for old, new in move_aside(config, env):
                log.info("--fresh: moved %s aside to %s", old, new)
            lock.acquire(run_folders(config))  # the new run's folders, in their place
        check_resumable(config, S3Mirror.from_uri(env.s3_uri) if env.s3_uri else None)
        # The model's files and the tokenized data, once for the node's ranks.
        files = gather(config, env, world_size=topo.world_size)
        if config.parallel.tensor == "auto":
            from training.estimate import tensor_at_start

            tensor, why = tensor_at_start(config, world_size=topo.world_size, nodes=topo.nnodes)
            print(why, flush=True)
            argv = [*argv, "--set", f"parallel.tensor={tensor}"]  # the workers' choice too
    except ConfigError as error:
        lock.release()
        print(f"{ERROR_PREFIX}{error}", file=sys.stderr)
        return ExitCode.BAD_CONFIG
    if files.data_folder is not None:
        os.environ[PREPARED_DATA_ENV] = str(files.data_folder)
    try:
        if startup.stop_requested():
            return stopped_before_training(startup.stop_requested())
        startup.begin(
            "launch",
            f"starting {topo.nproc_per_node} worker(s) on node {topo.node_rank} of "
            f"{topo.nnodes} (world size {topo.world_size}), output in {config.output_dir}",
        )
        return launch(topo, argv, config.watchdog, env.node_name, env.op_cache_dir)
    finally:
        lock.release()


def configure_logging(rank: int | None) -> str:
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
