"""What a job reads besides its config: a Hugging Face model's files and its tokenized data.

The launcher gathers them once per node, before any rank starts (`gather`): it fetches
the model (Hub, S3) into the node's caches, checks it against the job, and prepares the
tokenized data (training/text/prepare.py). Every bad input fails there, in one line. Its
workers then find the same files without the network (`for_worker`): the model's folder
by the same lookup, the data's folder from TRAIN_PREPARED_DATA, which the launcher sets.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from training.environment import TrainerEnv
from training.logs import adopt_hf_loggers
from training.spec.config import Config, ConfigError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class JobInputs:
    model_folder: Path | None = None  # the model.hf model's files on this node
    data_folder: Path | None = None  # the tokenized data (training/text/packing.py's format)


def gather(config: Config, env: TrainerEnv, *, world_size: int) -> JobInputs:
    """Fetch, check and prepare (the launcher, once per node)."""
    if not config.is_hf:
        return JobInputs()
    from training.hf.checks import check_model
    from training.hf.source import fetch

    adopt_hf_loggers()

    folder = fetch(config, env.cache_dir)
    log.info("model: %s in %s", config.model.hf, folder)
    check_model(config, folder)
    data = None
    if config.is_text and config.data.streaming:
        from training.text.stream import first_record

        first_record(config)  # the stream is there and has the fields the job reads
    if config.is_text:
        from training.text.prepare import prepare, splits

        if splits(config):
            data = prepare(
                config,
                model_folder=folder,
                cache_dir=env.cache_dir,
                s3_uri=env.s3_uri,
                progress=config.logging.progress_bar,
            )
            check_enough(config, data, world_size)
    return JobInputs(folder, data)


def for_worker(config: Config, env: TrainerEnv) -> JobInputs:
    """The files `gather` left on this node (a rank)."""
    if not config.is_hf:
        return JobInputs()
    from training.hf.source import local_folder

    adopt_hf_loggers()

    return JobInputs(local_folder(config, env.cache_dir), env.prepared_data)


def check_enough(config: Config, data: Path, world_size: int) -> None:
    """Every rank gets a sample of every prepared split."""
    from training.text.packing import Split, samples

    for name in ("train", "val"):
        if not (data / f"{name}.tokens").exists():
            continue
        count = len(samples(Split(data, name), config))
        if count < world_size:
            raise ConfigError(
                f"the {name} split holds {count} sample(s) of data.seq_len = "
                f"{config.data.seq_len} tokens, fewer than the {world_size} ranks: give it "
                "more text or lower data.seq_len"
            )
