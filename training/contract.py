"""The container's contract with whatever starts it: exit codes, environment, ports.

The boot unit (infra/node), the Slurm batch script, the image smoke test and the
trainer itself import these names from here; none keeps its own copy. Torch-free,
so the Pulumi program and the image tools import it without the trainer's
dependencies. docs/contracts.md explains each one to a user.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """What `python -m training` exits with, and what the caller should do about it."""

    DONE = 0  # trained to train.steps: nothing to restart
    FAILED = 1  # a crash: see the traceback; the boot unit retries a few times
    BAD_CONFIG = 2  # bad configuration or environment: nothing started; fix it, do not retry
    # Interrupted (SIGTERM, spot notice) and checkpointed, or stopped before training
    # started (nothing to save): either way nothing is lost, run the same command again.
    # 75 is EX_TEMPFAIL (sysexits.h): systemd's RestartForceExitStatus and Slurm's
    # RequeueExit both key on it, so both cases are restarted or requeued.
    INTERRUPTED = 75
    # The node failed its health gate (python -m training health): a bad GPU, ECC errors,
    # slow all-reduce, missing EFA. Retrying on the same node cannot help: the boot unit
    # stops the node, the Slurm job drains it and is requeued onto others. 69 is
    # EX_UNAVAILABLE (sysexits.h).
    NODE_UNHEALTHY = 69
    # Ctrl-C (SIGINT) before any rank finished a step, or a second Ctrl-C: stopped at once,
    # no checkpoint written, nothing restarted or requeued. 130 is 128 + SIGINT, the shell's
    # own code for a command Ctrl-C ended.
    CANCELLED = 130


# A hang (no rank finished a step within the watchdog's bound) ends the job with the
# restart code: the workers are killed, nothing after the last committed checkpoint is
# kept, and the boot unit and Slurm start it again from that checkpoint.
HANG_EXIT = ExitCode.INTERRUPTED


# How often a crashed run (exit 1, or a worker or launcher killed by a signal) is started
# again from the last committed checkpoint: at most CRASH_RESTARTS times within
# CRASH_WINDOW_S; the next crash in that window ends the job. The boot unit on a single
# node (systemd's StartLimitBurst and StartLimitIntervalSec) and the Slurm batch script
# on a cluster (in one allocation) both apply it.
CRASH_RESTARTS = 3
CRASH_WINDOW_S = 6 * 3600

EXIT_MEANING = {
    ExitCode.DONE: "done",
    ExitCode.FAILED: "a worker failed: the line above names it, its error is above that",
    ExitCode.BAD_CONFIG: "the configuration or environment was rejected; nothing was trained",
    ExitCode.INTERRUPTED: "interrupted and checkpointed: run the same command again to resume",
    ExitCode.NODE_UNHEALTHY: "this node failed its health gate: train on another node",
    ExitCode.CANCELLED: "stopped at once by Ctrl-C: no checkpoint was written by this run",
}

# The gate's last line on a failing node starts with this; the Slurm job drains the node
# with the rest of the line as the reason.
UNHEALTHY_PREFIX = "unhealthy: "

# The first words of the line that says why a job ended badly: a refusal (exit 2: bad
# configuration, nothing started) and the launcher's last line when a worker failed (exit
# 1) or the ranks hung (75). The node's job watcher records the last such line of a job's
# output as the reason of a job it marks failed.
ERROR_PREFIX = "error: "
FAILURE_PREFIX = "failed: "

# What the launcher says when a stop request came before any worker trained (exit 75).
STOPPED_BEFORE_TRAINING = (
    "stopped before training started: nothing to checkpoint; run the same command again"
)

# The rendezvous port of node 0 when TRAIN_MASTER_PORT is unset (torchrun's default).
DEFAULT_MASTER_PORT = 29500

# The module each worker runs (`python -m training.worker`), started by the launcher.
WORKER_MODULE = "training.worker"

# The job's own code (`python -m infra run --code DIR`): training/code.py puts it on the
# import path; the node's job watcher and the Slurm submission set it.
CODE_URI_ENV = "TRAIN_CODE_URI"

# Set by the launcher for its workers (not by users): the launcher's process id, so
# that a worker started after the launcher died knows it is an orphan.
LAUNCHER_PID_ENV = "TRAIN_LAUNCHER_PID"

# Set by torch's elastic launcher for each worker (torch.distributed.run): a job started
# from inside a worker (a test, a benchmark) must not inherit them, or it joins that job.
WORKER_VARIABLES = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
)

# Ranks on a node without a GPU when TRAIN_NPROC_PER_NODE is unset (one per GPU otherwise).
CPU_WORKERS = 2

# The environment the trainer reads. Each name maps to what it means; the boot
# script and the Slurm batch script set only names from this table.
ENV = {
    "TRAIN_CONFIG": "path of the TOML job config (default: the demo job)",
    "TRAIN_NNODES": "number of nodes (default 1)",
    "TRAIN_NODE_RANK": "this node's rank, 0..TRAIN_NNODES-1 (default 0)",
    "TRAIN_NPROC_PER_NODE": "workers on this node (default: one per GPU, 2 without a GPU)",
    "TRAIN_MASTER_ADDR": "address of node 0's rendezvous (default 127.0.0.1)",
    "TRAIN_MASTER_PORT": f"port of node 0's rendezvous (default {DEFAULT_MASTER_PORT})",
    "TRAIN_OUTPUT_DIR": "run folder: metrics, logs (overrides run.output_dir)",
    "TRAIN_CHECKPOINT_DIR": "checkpoint root on local disk (overrides checkpoint.dir)",
    "TRAIN_DATA_PATH": "training data file or folder (overrides data.path)",
    "TRAIN_S3_URI": "s3://bucket/prefix the committed checkpoints are mirrored to",
    "TRAIN_SPOT_ENDPOINT": "spot-notice endpoint to poll; empty turns polling off",
    "TRAIN_MIN_DRIVER": "the oldest NVIDIA driver the image's CUDA runs on (set by the image)",
    "TRAIN_USD_PER_HOUR": "the job's price per hour, all nodes: the end-of-run summary's cost",
    "TRAIN_CODE_URI": "the job's own code (run --code): an s3:// .tar.gz or a local folder",
    "TRAIN_CACHE_DIR": "node-local cache: tokenized data, S3 models (default ~/.cache/training)",
    "TRAIN_EXPECT_GPUS": "GPUs the health gate expects on this node (the catalog's count)",
    "TRAIN_EXPECT_GPU_MODEL": "GPU model the health gate expects, e.g. A100 (in NVML's name)",
    "TRAIN_EXPECT_BUSBW_GBPS": "all-reduce bus bandwidth across the node's GPUs the gate expects",
    "TRAIN_EXPECT_EFA": "EFA devices the health gate expects on this node",
    "TRAIN_EXPECT_FABRIC_BUSBW_GBPS": "all-reduce bus bandwidth across nodes `fabric` expects",
}

# huggingface_hub's own variables, which the stack sets for the container (the trainer
# reads neither: huggingface_hub does, huggingface_hub/constants.py). HF_TOKEN is a secret:
# the boot unit and the Slurm job read it from the stack's secret at each job's start
# (infra/jobs/hf_token.py), never from a file, a job object or a log line.
HF_TOKEN_ENV = "HF_TOKEN"  # a gated or private model's access token
HF_HOME_ENV = "HF_HOME"  # huggingface_hub's cache (models from the Hub): the node's local disk

# Set by the launcher for its workers (not by users): the folder where each rank
# records the last step it finished, which the launcher's hang watchdog reads.
HEARTBEAT_DIR_ENV = "TRAIN_HEARTBEAT_DIR"

# Set by the launcher for its workers (not by users): the folder of the job's tokenized
# data (training/text/prepare.py), which the launcher prepared before starting them.
PREPARED_DATA_ENV = "TRAIN_PREPARED_DATA"

# The goodput figures in status.json (and metrics.jsonl) that `python -m infra status`
# reads: the whole run's goodput, and its cost per billion tokens (per thousand images).
GOODPUT_FIELD = "goodput"
RUN_USD_FIELD = "usd"  # what the whole run has cost so far: its wall time at the stack's $/h
# Each start of the job (attempt) as [began, last counted] (ISO 8601, UTC): `status` and
# `jobs` read the stack's spend over those spans from the spend guard's ledger.
RUN_SPANS_FIELD = "run_spans"
PRICE_PER = {"tokens": ("billion tokens", 1e9), "images": ("thousand images", 1e3)}


def price_field(unit: str) -> str:
    """The name of the cost figure: usd_per_billion_tokens, usd_per_thousand_images."""
    return f"usd_per_{PRICE_PER[unit][0].replace(' ', '_')}"


def price_words(usd: float, unit: str) -> str:
    """'$142.86 per billion tokens'."""
    amount = f"{usd:,.2f}" if usd >= 1 else f"{usd:.3g}"
    return f"${amount} per {PRICE_PER[unit][0]}"
