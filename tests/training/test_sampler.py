"""The distributed sampler: disjoint ranks, seeded epochs, exact restore of its position."""

from __future__ import annotations

import itertools

import pytest

from training.sampler import ResumableDistributedSampler


def _take(sampler, n):
    """Consume n samples the way the trainer does: iterate, then advance."""
    taken = list(itertools.islice(iter(sampler), n))
    sampler.advance(len(taken))
    return taken


def test_ranks_split_an_epoch_without_overlap():
    ranks = [ResumableDistributedSampler(11, rank=r, world_size=3, seed=5) for r in range(3)]
    parts = [list(s) for s in ranks]
    assert all(len(p) == 3 for p in parts)  # the tail (11 = 3*3 + 2) is dropped evenly
    assert len(set().union(*parts)) == 9


def test_epochs_are_different_seeded_permutations():
    sampler = ResumableDistributedSampler(50, rank=0, world_size=1, seed=1)
    first = list(sampler)
    sampler.next_epoch()
    second = list(sampler)
    assert sorted(first) == sorted(second) == list(range(50))
    assert first != second
    assert first == list(ResumableDistributedSampler(50, rank=0, world_size=1, seed=1))


def test_state_restores_the_exact_position_mid_epoch():
    original = ResumableDistributedSampler(40, rank=1, world_size=2, seed=9)
    _take(original, 8)
    original.next_epoch()
    _take(original, 6)
    state = original.state_dict()
    expected_rest = list(original)

    restored = ResumableDistributedSampler(40, rank=1, world_size=2, seed=9)
    restored.load_state_dict(state)
    assert restored.epoch == 1 and len(restored) == 20 - 6
    assert list(restored) == expected_rest


def test_prefetched_but_unused_samples_are_not_counted():
    sampler = ResumableDistributedSampler(20, rank=0, world_size=1, seed=0)
    iterator = iter(sampler)
    used = [next(iterator) for _ in range(3)]
    _prefetched = [next(iterator) for _ in range(4)]  # e.g. a DataLoader worker ran ahead
    sampler.advance(len(used))
    assert sampler.state_dict()["consumed"] == 3


def test_a_new_world_size_keeps_the_global_position():
    """2 ranks consumed 6 samples each; 4 ranks continue from global sample 12."""
    old = [ResumableDistributedSampler(48, rank=r, world_size=2, seed=2) for r in range(2)]
    seen = set()
    for sampler in old:
        seen |= set(_take(sampler, 6))
    new = [ResumableDistributedSampler(48, rank=r, world_size=4, seed=2) for r in range(4)]
    for sampler in new:
        sampler.load_state_dict(old[0].state_dict())
    rest = set().union(*(set(s) for s in new))
    assert not rest & seen
    assert rest | seen == set(range(48))


def test_a_different_seed_is_refused():
    sampler = ResumableDistributedSampler(10, rank=0, world_size=1, seed=1)
    with pytest.raises(ValueError, match=r"run\.seed"):
        ResumableDistributedSampler(10, rank=0, world_size=1, seed=2).load_state_dict(
            sampler.state_dict()
        )
