"""Resolving the model and dataset a config names, and the launcher's preflight checks."""

from __future__ import annotations

import re

import numpy as np
import pytest

from training.components import build_dataset, build_model, preflight, resolve
from training.model import GPT
from training.spec.config import ConfigError, load_config


def test_resolve_names_the_key_and_what_went_wrong():
    assert resolve("json:dumps", "model.builder").__name__ == "dumps"
    with pytest.raises(
        ConfigError, match=re.escape("model.builder = 'nopkg.models:build': cannot import")
    ):
        resolve("nopkg.models:build", "model.builder")
    with pytest.raises(
        ConfigError, match=re.escape("data.builder = 'json:nothing': json has no function")
    ):
        resolve("json:nothing", "data.builder")


def test_preflight_refuses_a_missing_data_path(tmp_path):
    config = load_config(None, ["data.kind=tokens", f"data.path={tmp_path / 'none.bin'}"], env={})
    with pytest.raises(ConfigError, match="does not exist"):
        preflight(config)


def test_a_too_short_token_file_is_a_config_error(tmp_path):
    short = tmp_path / "train.bin"
    short.write_bytes(np.arange(4, dtype=np.uint16).tobytes())
    config = load_config(None, ["data.kind=tokens", f"data.path={tmp_path}"], env={})
    # The launcher's preflight says so once, before any rank would build the dataset.
    with pytest.raises(
        ConfigError, match=r"holds 4 tokens, fewer than one window of data\.seq_len"
    ):
        preflight(config)
    with pytest.raises(ConfigError, match=r"fewer than data\.seq_len"):
        build_dataset(config)


def test_gpt_from_preset_with_shape_overrides():
    config = load_config(
        None, ["model.n_layer=3", "model.n_embd=32", "data.vocab_size=100"], env={}
    )
    model = build_model(config)
    assert isinstance(model, GPT)
    assert (len(model.blocks), model.config.n_embd, model.config.n_head) == (3, 32, 2)
    assert model.wte.num_embeddings == 100
