"""What the commands run on the cluster's head node (through SSM, as root) and how they read it.

The queue, a clean stop, a start and a job's log, each one shell script of Slurm's own
commands; tests/infra/cluster/test_control.py runs them on a real Slurm cluster.

Slurm facts they rely on (https://slurm.schedmd.com/scontrol.html, squeue.html), beside
those of holding the queue (infra/functions/slurm_queue.py, which the spend guard shares):
- A held job is a pending job of priority 0: that is what `scontrol hold` sets (its
  reason reads JobHeldUser, JobHeldAdmin or "job requeued in held state").
- `scontrol show job` names the job's output file (StdOut=); the job writes it in the
  shared /home, which the head node serves. Slurm forgets a job MinJobAge seconds (300 by
  default, slurm.conf(5)) after it ends; its log is then found by name under /home.

Where they run: as SSM runs them, so each is POSIX sh and puts /opt/slurm/bin on PATH
itself (infra/functions/slurm_queue.py says why).

Pure Python: no AWS here. infra/commands/ sends the scripts and parses the replies.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from infra.cluster.config import QUEUE
from infra.cluster.sbatch import LOG_FILE
from infra.functions.slurm_queue import JOB_END_WAIT_S, SLURM_PATH, hold_script, squeue

# SSM keeps the first 24,000 characters of a command's output (GetCommandInvocation,
# StandardOutputContent): a log is read in pieces well under that.
LOG_PIECE_BYTES = 16_000
# How long the stop script waits for the jobs to end (infra/functions/slurm_queue.py).
STOP_WAIT_S = JOB_END_WAIT_S
# Where a finished job's log is looked for: the cluster's shared home folders, where jobs are
# submitted from, a few folders deep.
LOG_SEARCH_ROOT = "/home"
LOG_SEARCH_DEPTH = 4


@dataclass(frozen=True)
class QueuedJob:
    id: str
    name: str
    state: str  # RUNNING, PENDING, COMPLETING, ...
    nodes: int
    elapsed: str  # squeue's [days-]hours:minutes:seconds
    priority: int
    reason: str  # why it is pending; "None" while it runs

    @property
    def held(self) -> bool:
        return self.state == "PENDING" and self.priority == 0


def queue_script(partition: str = QUEUE) -> str:
    return SLURM_PATH + squeue(partition) + "\n"


def parse_queue(text: str) -> list[QueuedJob]:
    """squeue's lines (queue_script) -> the jobs, in the order squeue printed them."""
    jobs = []
    for line in text.splitlines():
        if not line.strip():
            continue
        job_id, name, state, nodes, elapsed, priority, reason = line.split("|", 6)
        jobs.append(QueuedJob(job_id, name, state, int(nodes), elapsed, int(priority), reason))
    return jobs


def stop_script(partition: str = QUEUE, wait_s: int = STOP_WAIT_S) -> str:
    """Hold every job of the queue; running ones checkpoint and end first. Prints the queue."""
    return hold_script(partition, wait_s)


def release_script(partition: str = QUEUE, only: tuple[str, ...] | None = None) -> str:
    """Release every held job of the queue (`only`: those of these ids): Slurm starts nodes
    for them. Prints the jobs it released, as squeue listed them before (held)."""
    if only == ():
        return SLURM_PATH  # nothing to release
    if only is not None and not all(job_id.isdigit() for job_id in only):
        raise ValueError(f"Slurm job ids are numbers, got {only!r}")
    jobs = f"--jobs={','.join(only)} " if only else ""
    return f"""{SLURM_PATH}set -u
{squeue(partition)} {jobs}--states=PENDING | while IFS= read -r line; do
  job=${{line%%|*}}
  priority=$(printf '%s\\n' "$line" | cut -d'|' -f6)
  if [ "$priority" = 0 ]; then
    scontrol release "$job"
    printf '%s\\n' "$line"
  fi
done
"""


def log_script(
    job_id: str,
    offset: int,
    piece_bytes: int = LOG_PIECE_BYTES,
    search_root: str = LOG_SEARCH_ROOT,
) -> str:
    """The job's output file from byte `offset` (-1: its last piece), at most a piece.

    First line: the offset the piece starts at; then the piece itself.
    """
    if not job_id.isdigit():
        raise ValueError(f"a Slurm job id is a number, got {job_id!r}")
    name = LOG_FILE.replace("%j", job_id)
    root = shlex.quote(search_root)
    return f"""{SLURM_PATH}set -eu
file=$(scontrol --oneliner show job {job_id} 2>/dev/null |
  sed -n 's/.* StdOut=\\([^ ]*\\).*/\\1/p')
if [ -z "$file" ]; then
  file=$(find {root} -maxdepth {LOG_SEARCH_DEPTH} -name {name} -print 2>/dev/null | head -n 1)
fi
if [ -z "$file" ] || [ ! -f "$file" ]; then
  echo "job {job_id} has no log: Slurm does not know it, and no {name} is under {root}" >&2
  exit 3
fi
size=$(stat -c %s "$file")
offset={offset}
if [ "$offset" -lt 0 ]; then
  offset=$((size > {piece_bytes} ? size - {piece_bytes} : 0))
fi
echo "$offset"
tail -c +$((offset + 1)) "$file" | head -c {piece_bytes}
"""


def parse_log_piece(text: str) -> tuple[int, str]:
    """log_script's reply -> (offset the piece starts at, the piece)."""
    first, _, piece = text.partition("\n")
    return int(first), piece
