"""The watchdog's bound and its naming of the ranks that stopped first (the whole path, with
real ranks and a real hang, is tests/training/faults/test_hang.py)."""

from __future__ import annotations

from pathlib import Path

from training.spec.config import WatchdogConfig
from training.watchdog import HangWatchdog, Heartbeat, stopped_first

# The shapes of faulthandler's dump: each thread, most recent call first.
WAITING = """Thread 0x00007f01 (most recent call first):
  File "/usr/lib/python3/threading.py", line 324 in wait

Current thread 0x00007f02 (most recent call first):
  File "/venv/site-packages/torch/distributed/distributed_c10d.py", line 2501 in all_reduce
  File "/src/training/trainer.py", line 398 in _mean_over_ranks
"""
STUCK = """Current thread 0x00007f03 (most recent call first):
  File "/src/training/data.py", line 80 in __getitem__
  File "/src/training/trainer.py", line 230 in _loop
"""


def test_the_bound_is_the_floor_until_steps_are_slow_then_a_multiple_of_them():
    watchdog = HangWatchdog(
        Path("."),
        WatchdogConfig(hang_floor_s=60, hang_step_factor=10, hang_startup_s=900),
        2,
        first_rank=0,
        node="n1",
    )
    assert watchdog.bound_s(started=False) == 900
    watchdog._step_times = [0.5, 0.4, 0.6]
    assert watchdog.bound_s(started=True) == 60  # 10 x 0.5 s is under the floor
    watchdog._step_times = [12.0, 30.0, 11.0]  # a checkpoint step among normal ones
    assert watchdog.bound_s(started=True) == 120  # 10 x the median, 12 s


def test_the_rank_not_waiting_in_a_collective_stopped_first():
    steps = {0: 7, 1: 7, 2: 7, 3: 7}
    stacks = {0: WAITING, 1: WAITING, 2: STUCK, 3: WAITING}
    assert stopped_first(steps, stacks) == [2]


def test_the_ranks_with_fewest_steps_stopped_first():
    assert stopped_first({0: 8, 1: 7, 2: 8}, {0: WAITING, 1: WAITING, 2: WAITING}) == [1]


def test_when_every_rank_waits_alike_all_are_named():
    assert stopped_first({0: 3, 1: 3}, {0: WAITING, 1: WAITING}) == [0, 1]
    assert stopped_first({0: 3, 1: 3}, {}) == [0, 1]


def test_a_heartbeat_records_the_last_step_for_the_watchdog(tmp_path):
    beat = Heartbeat(tmp_path, rank=3)
    beat.beat(41)
    beat.beat(42)
    watchdog = HangWatchdog(tmp_path, WatchdogConfig(), nproc=2, first_rank=2, node="n1")
    assert watchdog.steps() == {2: -1, 3: 42}


def test_a_part_of_a_save_changes_the_record_and_leaves_the_step(tmp_path):
    """A rank waiting for a save in flight, or writing the last one, finishes no step; each
    file written and each collective step of the save is progress the watchdog sees."""
    beat = Heartbeat(tmp_path, rank=0)
    watchdog = HangWatchdog(tmp_path, WatchdogConfig(), nproc=1, first_rank=0, node="n1")
    beat.beat(12)
    before = watchdog._read_records()
    beat.progress()
    assert watchdog._read_records() != before
    assert watchdog.steps() == {0: 12}
    assert watchdog._read_records() == {0: (12, 1)}
