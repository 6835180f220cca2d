"""A rank made slower than the others is named as a straggler: log, metrics, status."""

from __future__ import annotations

import socket

import pytest

from tests.training.faults.injection import fault_env
from tests.training.jobs import TINY, job_env, run_job

pytestmark = pytest.mark.multiprocess

WINDOWS = 3


def test_a_slowed_rank_is_named_after_its_windows_in_a_row(tmp_path):
    out = tmp_path / "run"
    env = job_env(out)
    # Rank 1 waits 0.3 s for each batch: its own work per step is far above rank 0's
    # (a tiny CPU forward pass), so it stands at about twice the median of two ranks.
    env.update(fault_env("batches", rank=1, slow_s=0.3))
    job = run_job(
        out,
        *TINY,
        "train.steps=8",
        "watchdog.straggler_factor=1.5",
        f"watchdog.straggler_windows={WINDOWS}",
        env=env,
    )
    assert job.returncode == 0, job.stderr[-3000:]
    records = job.metrics  # one per step: a logging window each
    assert [r["slowest_rank"] for r in records] == [1] * 8
    assert all(1.5 < r["slowest_rank_ratio"] < 2 for r in records), records
    # Named once the slowness lasted WINDOWS windows, and at each window after.
    assert [r.get("straggler_rank") for r in records] == [None] * (WINDOWS - 1) + [1] * 6
    warnings = [line for line in job.stderr.splitlines() if "straggler: rank 1 on node" in line]
    assert len(warnings) == 6
    assert f"straggler: rank 1 on node {socket.gethostname()} spent " in warnings[0]
    assert warnings[0].endswith(f"for {WINDOWS} logging windows in a row")
