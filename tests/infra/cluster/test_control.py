"""The head-node scripts (infra/cluster/control.py) on the real two-node Slurm cluster, whose
partition is named as the stack's queue.

A stop must leave every job of the queue held, a running one only after its SIGTERM
checkpoint, and keep it from starting again; a release must start it, resuming from that
checkpoint; the queue and the log must read what Slurm and the job wrote. The story with a
real training job runs them under the commands that use them (stop, start, logs):
tests/infra/commands/test_cluster_stack.py.
"""

from __future__ import annotations

import subprocess
import time

import pytest

from infra.cluster.control import (
    log_script,
    parse_log_piece,
    parse_queue,
    queue_script,
    release_script,
    stop_script,
)
from tests.support.head_node import run_on_head_node
from tests.support.tools import require_tool

SCRIPTS = {
    "queue": queue_script(),
    "stop": stop_script(),
    "release": release_script(),
    "release-some": release_script(only=("12", "13")),
    "log": log_script("12", -1),
}


@pytest.mark.parametrize("name", SCRIPTS)
def test_each_script_is_posix_sh_with_slurms_folder_on_path(name):
    """SSM runs them with sh, no login profile; ParallelCluster's Slurm is in /opt/slurm/bin."""
    script = SCRIPTS[name]
    assert script.splitlines()[0] == 'PATH="/opt/slurm/bin:$PATH"'
    checked = subprocess.run(
        [require_tool("shellcheck", "shellcheck"), "--shell=sh", "-"],
        input=script,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert checked.returncode == 0, checked.stdout


def on_head_node(slurm, script: str) -> str:
    result = run_on_head_node(slurm, script)
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.mark.multiprocess
def test_an_empty_queue_stops_and_releases_at_once(slurm):
    assert parse_queue(on_head_node(slurm, stop_script())) == []
    assert parse_queue(on_head_node(slurm, release_script())) == []


def test_the_log_is_read_in_pieces_from_any_offset(slurm):
    """Any job's output file: here a batch job that prints numbered lines, not a training."""
    work = slurm.workspace()
    job_id = slurm.command(
        "sbatch", "--parsable", f"--chdir={work}", "--output=train-%j.out",
        "--wrap=seq -f 'line %03g of a job log' 1 40", as_job_user=True,
    ).strip().split(";")[0]  # fmt: skip
    deadline = time.monotonic() + 60
    while (state := slurm.job(job_id))["JobState"] != "COMPLETED":
        assert time.monotonic() < deadline, state
        time.sleep(0.2)
    whole = (work / f"train-{job_id}.out").read_bytes()
    assert whole.decode().splitlines() == [f"line {n:03d} of a job log" for n in range(1, 41)]

    pieces, offset = [], 0
    while True:
        start, piece = parse_log_piece(
            on_head_node(slurm, log_script(job_id, offset, piece_bytes=100))
        )
        assert start == offset
        if not piece:
            break
        pieces.append(piece.encode())
        offset += len(piece.encode())
    assert b"".join(pieces) == whole

    start, last = parse_log_piece(on_head_node(slurm, log_script(job_id, -1, piece_bytes=100)))
    assert start == len(whole) - 100 and last.encode() == whole[-100:]


@pytest.mark.multiprocess
def test_a_job_slurm_has_forgotten_is_found_by_its_log_name(slurm, tmp_path):
    # Slurm forgets a job MinJobAge after it ends: an id it does not know, with a log on disk.
    folder = tmp_path / "alice" / "runs"
    folder.mkdir(parents=True)
    (folder / "train-999999.out").write_text("step 1\nstep 2\n")
    start, piece = parse_log_piece(
        on_head_node(slurm, log_script("999999", 0, search_root=str(tmp_path)))
    )
    assert (start, piece) == (0, "step 1\nstep 2\n")

    missing = run_on_head_node(slurm, log_script("999998", 0, search_root=str(tmp_path)))
    assert missing.returncode != 0
    assert "job 999998 has no log" in missing.stderr and "train-999998.out" in missing.stderr
