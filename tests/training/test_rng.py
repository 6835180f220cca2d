"""RNG state for checkpoints: every generator the trainer uses comes back exactly."""

from __future__ import annotations

import random

import numpy as np
import torch

from training import rng


def _draw() -> tuple:
    return random.random(), float(np.random.rand()), torch.rand(3).tolist()


def test_capture_and_restore_replay_every_generator():
    random.seed(1)
    np.random.seed(1)
    torch.manual_seed(1)
    state = rng.capture()
    first = _draw()
    assert _draw() != first
    rng.restore(state)
    assert _draw() == first


def test_each_rank_gets_its_own_state_back_and_missing_ranks_are_reported():
    torch.manual_seed(5)
    states = rng.gather_all_ranks()  # no process group: just this process
    expected = torch.rand(2)
    torch.manual_seed(6)
    assert rng.restore_for_rank(states, 0)
    assert torch.equal(torch.rand(2), expected)
    assert not rng.restore_for_rank(states, 1)
