"""A rank that hangs in a collective or on its data loader is found, its stack (and its
loader workers') shown, and the job restarts from its last checkpoint; a normal run with
checkpoints, slow ones included, never trips the watchdog."""

from __future__ import annotations

import pytest

from examples.image_classification.make_images import make_images
from tests.training.faults.injection import fault_env
from tests.training.jobs import TINY, job_env, read_metrics, run_job, shared_run
from tests.training.multirank import REPO_ROOT
from training.contract import HANG_EXIT

pytestmark = pytest.mark.multiprocess
HANG_STORY = "a real 2-rank job run to a hang, or past one"

STEPS, CHECKPOINT_EVERY, HANG_AT = 40, 5, 12
FLOOR_S = 10  # far above a tiny CPU step (well under a second) and a checkpoint save
JOB = (
    *TINY,
    "zero.stage=2",
    f"checkpoint.every_steps={CHECKPOINT_EVERY}",
    f"watchdog.hang_floor_s={FLOOR_S}",
    "watchdog.hang_step_factor=10",
    "watchdog.hang_startup_s=300",
)


@pytest.mark.slow(reason=HANG_STORY, seconds=180)
def test_a_normal_run_with_checkpoints_raises_no_alarm(tmp_path_factory):
    run = shared_run(tmp_path_factory, *JOB)  # asserts exit 0
    assert "hang:" not in run.stderr
    assert [r["step"] for r in run.metrics] == list(range(1, STEPS + 1))


@pytest.mark.slow(reason=HANG_STORY, seconds=180)
def test_an_image_job_with_evaluations_and_checkpoints_raises_no_alarm(tmp_path):
    images = make_images(tmp_path / "images", classes=4, train=64, val=32)
    run = run_job(
        tmp_path / "run",
        "train.steps=8",
        "checkpoint.every_steps=2",
        "logging.eval_every_steps=2",  # a held-out evaluation every other step
        "logging.every_steps=1",
        "logging.progress_bar=false",
        "logging.tensorboard=false",
        "scheduler.warmup_steps=2",
        "precision.bf16=false",  # the l4x1 job's bf16: no half-precision convolutions on a CPU
        "model.preset=resnet-tiny",
        "data.num_classes=4",
        "data.image_size=32",
        "train.global_batch_size=16",
        "train.micro_batch_size=8",
        f"data.path={images / 'folder'}",
        # An evaluation starts its DataLoader workers: seconds on a busy CPU, many normal
        # steps; the floor is what covers it.
        "watchdog.hang_floor_s=60",
        config=REPO_ROOT / "jobs" / "l4x1.toml",
        timeout=400,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "hang:" not in run.stderr
    assert [r["step"] for r in run.metrics if "val_accuracy" in r] == [2, 4, 6, 8]


@pytest.mark.slow(reason=HANG_STORY, seconds=180)
def test_a_rank_hung_in_a_collective_is_found_and_the_job_resumes_exactly(
    tmp_path, tmp_path_factory, ci_log
):
    out = tmp_path / "run"
    env = job_env(out)
    # The per-step loss all-reduce: rank 1 never reaches it.
    env.update(fault_env("window", at=HANG_AT, rank=1, action="hang", flag=tmp_path / "hung"))
    hung = run_job(out, *JOB, env=env, timeout=300)
    assert hung.returncode == HANG_EXIT == 75, hung.stderr[-3000:]
    assert (tmp_path / "hung").exists()  # rank 1 did hang

    # Found within the bound: the floor (steps are far shorter), plus the watchdog's
    # half-second poll.
    sentence = next(line for line in hung.stderr.splitlines() if "hang: no rank" in line)
    silent_s = float(sentence.split("for ")[1].split(" s")[0])
    assert FLOOR_S <= silent_s <= FLOOR_S + 2, sentence
    assert "rank 1 on node " in sentence, sentence
    assert f"after step {HANG_AT}" in sentence, sentence
    assert "exit code 75 to restart from the last committed checkpoint" in sentence
    ci_log(f"hang test: {sentence.split('] ERROR training.watchdog: ')[-1]}")
    # Every rank's stack, labelled: rank 1 in the injected hang, rank 0 waiting in gloo.
    stack_0 = hung.stderr.split("Python stack of rank 0:")[1].split("Python stack of rank 1:")[0]
    stack_1 = hung.stderr.split("Python stack of rank 1:")[1]
    assert "all_reduce" in stack_0 and "torch/distributed/" in stack_0, stack_0
    assert "sitecustomize.py" in stack_1 and "_act" in stack_1, stack_1

    last_checkpoint = (HANG_AT // CHECKPOINT_EVERY) * CHECKPOINT_EVERY
    resumed = run_job(out, *JOB, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resumed from {out / 'checkpoints'}/step_{last_checkpoint:08d}" in resumed.stderr

    # The restarted steps replace the lost ones; together they are the uninterrupted run.
    by_step = {record["step"]: record for record in read_metrics(out)}
    baseline = shared_run(tmp_path_factory, *JOB).metrics
    assert sorted(by_step) == list(range(1, STEPS + 1))
    for want in baseline:
        got = by_step[want["step"]]
        assert got["loss"] == pytest.approx(want["loss"], rel=1e-6, abs=1e-7), want["step"]
    ci_log(
        f"hang test: resumed from step {last_checkpoint} to step {STEPS}, "
        "losses equal to the uninterrupted run's"
    )


SLOW_WRITE_S = 3.3  # rank 0 writes 2 files a save: 6.6 s a save, against the bound of 10 s


@pytest.mark.slow(reason=HANG_STORY, seconds=120)
def test_saves_of_two_thirds_of_the_bound_end_the_run_without_an_alarm(tmp_path):
    """Every save takes 6.6 s on rank 0 (a slow disk) and the steps a tenth of a second: the
    save of step 5 is still being written at step 10, whose save waits for it, and the last
    save waits for step 10's, then writes its own (13 s without a finished step). Each is
    shorter than the bound, and none is a hang."""
    out = tmp_path / "run"
    env = job_env(out)
    env.update(fault_env("writes", slow_s=SLOW_WRITE_S))
    job = (*JOB, "train.steps=12")  # checkpoints at 5, 10 and the end, 12
    run = run_job(out, *job, env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "hang:" not in run.stderr
    assert [r["step"] for r in run.metrics] == list(range(1, 13))
    assert (out / "checkpoints" / "step_00000012" / "commit.json").is_file()


@pytest.mark.slow(reason=HANG_STORY, seconds=180)
def test_a_rank_stuck_in_its_data_loader_is_named_with_the_loader_workers_stack(tmp_path):
    """Rank 1's DataLoader worker stops for good after 20 items; rank 1 waits for its batch
    outside any collective, rank 0 waits for rank 1 in one. The dump shows where the worker
    is, not only that rank 1 waits for it."""
    out = tmp_path / "run"
    hung = run_job(
        out,
        *JOB,
        "data.num_workers=1",
        "data.builder=tests.training.faults.stuck_loader:build",
        "data.options={stuck_rank = 1, stuck_after = 20}",
        timeout=300,
    )
    assert hung.returncode == HANG_EXIT, hung.stderr[-3000:]
    sentence = next(line for line in hung.stderr.splitlines() if "hang: no rank" in line)
    assert "rank 1 on node " in sentence, sentence
    worker = hung.stderr.split("Python stack of rank 1's data-loader worker")[1]
    assert "wait_forever_in_the_loader" in worker and "stuck_loader.py" in worker, worker
