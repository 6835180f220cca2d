"""A Hugging Face run's checkpoint back in Hugging Face's format: a folder that
`from_pretrained` loads (config.json, the tokenizer, sharded safetensors).

Every checkpoint of such a run carries what the export needs besides the weights
(`metadata`, in DeepSpeed's client state, which rank 0 saves in mp_rank_00_model_states.pt):
the model's config.json and generation_config.json, its tokenizer's files (and its own
Python code when model.trust_remote_code is on), and the task. The weights are the full
fp32 master weights consolidated from the checkpoint (training/checkpoint/export.py),
written by transformers' own `save_pretrained` in `dtype`, sharded at SHARD_SIZE.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch

from training.hf.source import MODEL_FILES
from training.spec.config import Config

METADATA_KEY = "hf_model"  # in a checkpoint's client state
SHARD_SIZE = "5GB"  # save_pretrained's shards: the Hub's usual size
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def metadata(config: Config, folder: Path) -> dict:
    """What an export needs besides the weights, from the model's folder."""
    patterns = (*MODEL_FILES, "*.py") if config.model.trust_remote_code else MODEL_FILES
    names = sorted({p.name for pattern in patterns for p in folder.glob(pattern) if p.is_file()})
    return {
        "task": config.model.task,
        "source": config.model.hf,
        "trust_remote_code": config.model.trust_remote_code,
        "num_labels": config.model.num_labels,
        "dtype": "bf16" if config.precision.bf16 else "fp16" if config.precision.fp16 else "fp32",
        "files": {name: (folder / name).read_bytes() for name in names},
    }


def export_folder(
    state: dict[str, torch.Tensor], carried: dict, out: Path, dtype: str | None = None
) -> int:
    """Write the folder; the number of parameters written. `state` holds the trainer's
    module's keys (`model.` + the transformers model's own)."""
    from transformers import AutoConfig

    from training.hf.model import auto_class
    from training.logs import adopt_hf_loggers

    adopt_hf_loggers()

    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        for name, body in carried["files"].items():
            (staging / name).write_bytes(body)
        trust = carried["trust_remote_code"]
        hf_config = AutoConfig.from_pretrained(staging, trust_remote_code=trust)
        weights = {
            key.removeprefix("model."): tensor.to(DTYPES[dtype or carried["dtype"]])
            for key, tensor in state.items()
        }
        with torch.device("meta"):
            model = auto_class(carried["task"]).from_config(
                hf_config, trust_remote_code=trust, dtype=DTYPES[dtype or carried["dtype"]]
            )
        model.load_state_dict(weights, strict=True, assign=True)
        model.tie_weights()
        model.save_pretrained(staging, max_shard_size=SHARD_SIZE)
        _keep_generation_config(carried, staging)
        umask = os.umask(0)
        os.umask(umask)
        staging.chmod(0o777 & ~umask)  # mkdtemp made it private
        staging.rename(out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return sum({id(p): p.numel() for p in model.parameters()}.values())


def _keep_generation_config(carried: dict, folder: Path) -> None:
    """The model's own generation defaults, as it came (save_pretrained writes its own)."""
    original = carried["files"].get("generation_config.json")
    if original is not None:
        json.loads(original)  # refuse to carry something that is not JSON
        (folder / "generation_config.json").write_bytes(original)
