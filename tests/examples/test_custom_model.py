"""examples/custom_model: a user's own model and dataset, named in the config, trained."""

from __future__ import annotations

import pytest
import torch

from tests.training.jobs import run_job
from tests.training.multirank import REPO_ROOT
from training.components import build_dataset, build_model, preflight
from training.spec.config import ConfigError, load_config

CONFIG = REPO_ROOT / "examples" / "custom_model" / "config.toml"


def test_config_builds_the_users_model_and_dataset():
    config = load_config(CONFIG, env={})
    preflight(config)
    model = build_model(config)
    assert type(model).__name__ == "LSTMLanguageModel"
    assert model.head.out_features == 32
    dataset = build_dataset(config)
    inputs, targets = dataset[0]
    assert inputs.shape == (32,) and torch.equal(inputs[4:8], inputs[:4])  # the motif repeats
    assert torch.equal(inputs[1:], targets[:-1])


def test_a_missing_builder_fails_before_launch(tmp_path):
    config = load_config(CONFIG, ["model.builder=examples.custom_model.model:missing"], env={})
    with pytest.raises(ConfigError, match="has no function 'missing'"):
        preflight(config)


@pytest.mark.multiprocess
def test_example_trains_through_the_real_launcher(tmp_path):
    job = run_job(
        tmp_path,
        "logging.every_steps=5",
        "logging.progress_bar=false",
        config=CONFIG,
    )
    assert job.returncode == 0, job.stderr[-3000:]
    losses = job.losses
    assert len(losses) == 12
    assert losses[-1] < 0.8 * losses[0]
    checkpoint = torch.load(
        tmp_path / "checkpoints" / "step_00000060" / "mp_rank_00_model_states.pt",
        weights_only=False,
    )
    assert any(name.startswith("lstm.") for name in checkpoint["module"])
