"""`python -m training.worker`: one rank of a job, started by the launcher (training/launcher.py).

torch's elastic launcher sets RANK, LOCAL_RANK and WORLD_SIZE for it, the launcher its own
TRAIN_LAUNCHER_PID and TRAIN_HEARTBEAT_DIR; the arguments are the user's, passed on. Users
run `python -m training`, never this.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import NoReturn

from common.setup_errors import explain
from training import logs, startup
from training.contract import ERROR_PREFIX, ExitCode
from training.environment import TopologyError, TrainerEnv, read_environment

log = logging.getLogger("training")


def main(argv: list[str], env: TrainerEnv) -> NoReturn:
    """Train as rank env.rank, then exit with the rank's code (training.contract.ExitCode)."""
    from training.checkpoint.checkpointer import CheckpointError
    from training.cli import configure_logging, load, parser
    from training.interrupt import StopFlag, spot_endpoint_from_env
    from training.launcher import AFTER_PEER, die_with_launcher, peer_error, record_worker_error
    from training.oom import OutOfMemory
    from training.spec.config import ConfigError
    from training.trainer import Placement, Trainer
    from training.watchdog import install_stack_dump

    startup.release_collection()
    args = parser().parse_args(argv)
    startup.watch_op_builds(env.heartbeat_dir, env.rank or 0)
    die_with_launcher(env)
    placement = Placement.from_env(env)
    install_stack_dump(env.heartbeat_dir, placement.rank)
    where = configure_logging(rank=placement.rank)
    # Listening from here on; a request that came during start-up is handed over.
    stop = StopFlag(spot_endpoint=spot_endpoint_from_env(env))
    stop.start()
    if startup.stop_requested():
        stop.request_stop(startup.stop_requested())
    try:
        config, _ = load(args, env, placement.world_size)
        logs.write_to(config.output_dir / "logs" / f"rank{placement.rank}.log", where)
        code = Trainer(config, placement, env, stop=stop).run()
    except ConfigError as error:
        print(f"{ERROR_PREFIX}{error}", file=sys.stderr)
        code = ExitCode.BAD_CONFIG
    except CheckpointError as error:  # says what happened and what to do: no traceback
        log.error("rank %d: %s", placement.rank, error)
        record_worker_error(env.heartbeat_dir, placement.rank, str(error))
        code = ExitCode.FAILED
    except OutOfMemory as error:
        print(f"{ERROR_PREFIX}{error}", file=sys.stderr)
        record_worker_error(env.heartbeat_dir, placement.rank, str(error))
        code = error.exit_code
    except Exception as error:
        # A full disk or a folder it cannot write is said in one line (the launcher repeats
        # it once for the job); anything else is a bug, with its traceback.
        setup = explain(error)
        broken = setup is None and _collective_broke(error)
        peer = peer_error(env.heartbeat_dir, placement.rank) if broken else None
        if setup is not None:
            log.error("rank %d: %s", placement.rank, setup)
        elif peer is not None:  # the cause is the other rank's, already said
            log.error("rank %d stopped: another rank failed first (%s)", placement.rank, peer)
        else:
            log.exception("rank %d failed", placement.rank)
        reason = setup or (f"{AFTER_PEER}{peer}" if peer else None)
        reason = reason or f"{type(error).__name__}: {error}"
        record_worker_error(env.heartbeat_dir, placement.rank, reason)
        code = ExitCode.FAILED
    # Interpreter shutdown spends seconds in native finalizers (communication backends)
    # with nothing left to do: checkpoints are fsynced and metrics closed by now. Exit
    # directly, so that the job's end (and a spot stop's deadline) is not spent there.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _collective_broke(error: Exception) -> bool:
    """A collective that failed because a peer rank went away: torch raises DistError
    subclasses (torch.distributed), or a RuntimeError from gloo naming the lost connection."""
    import torch.distributed

    if isinstance(error, torch.distributed.DistError):
        return True
    text = str(error)
    return isinstance(error, RuntimeError) and ("gloo" in text.lower() or "NCCL" in text)


if __name__ == "__main__":
    startup.listen()  # before the imports, which take seconds
    startup.hold_collection()
    logs.divert_library_warnings()
    try:
        environment = read_environment()
    except TopologyError as error:  # the launcher checked it: only a worker started by hand
        print(f"{ERROR_PREFIX}{error}", file=sys.stderr)
        sys.exit(ExitCode.BAD_CONFIG)
    if environment.rank is None:
        print(
            f"{ERROR_PREFIX}python -m training.worker is one rank of a job, started by the "
            "launcher (RANK is unset): run python -m training",
            file=sys.stderr,
        )
        sys.exit(ExitCode.BAD_CONFIG)
    startup.speak_as_worker(environment.rank, environment.launcher_pid)
    startup.begin("imports", "torch, DeepSpeed and the trainer")
    main(sys.argv[1:], environment)
