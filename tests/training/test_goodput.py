"""Goodput: where a run's wall time went, per start and per run, and what it cost."""

from __future__ import annotations

import json
import re
import time

import pytest

from tests.training.faults.injection import fault_env
from tests.training.jobs import TINY, job_env, read_metrics, run_job
from training import startup
from training.goodput import GOODPUT_FILE, Attempt, GoodputClock, combine


def attempt(**seconds) -> Attempt:
    return Attempt(started_at=0.0, first_step=0, **seconds)


def test_goodput_is_productive_over_wall_and_the_rest_is_other():
    a = attempt(
        wall_s=100.0,
        startup={"imports": 6.0, "op build": 4.0},
        productive_s=70.0,
        checkpoint_s=5.0,
        data_wait_s=8.0,
        tokens=7_000_000,
    )
    report = combine([a], gpus=8, usd_per_hour=36.0)
    assert report.goodput == 0.7
    assert report.parts_s["startup"] == 10.0
    assert report.parts_s["other"] == pytest.approx(7.0)
    assert sum(report.parts_s.values()) == pytest.approx(100.0)
    assert report.gpu_hours == pytest.approx(8 * 100 / 3600)
    # $36/h for 100 s is $1; 7M tokens: $1 / 7e6 * 1e9.
    assert report.usd_per_work("tokens") == pytest.approx(142.857142857, rel=1e-9)
    assert report.describe("tokens") == (
        "goodput 70.0% (startup 10.0%, checkpoint 5.0%, data wait 8.0%, other 7.0%), "
        "$142.86 per billion tokens"
    )
    fields = report.fields("tokens")
    assert fields["usd_per_billion_tokens"] == pytest.approx(142.857142857, rel=1e-9)
    assert fields["startup_op_build_s"] == 4.0


def test_an_image_job_is_priced_per_thousand_images():
    report = combine([attempt(wall_s=3600.0, productive_s=3600.0, tokens=2000)], gpus=1,
                     usd_per_hour=4.0)  # fmt: skip
    assert report.describe("images") == "goodput 100.0%, $2.00 per thousand images"


def test_the_run_adds_up_its_starts():
    first = attempt(wall_s=50.0, productive_s=30.0, tokens=300)
    second = attempt(wall_s=30.0, productive_s=10.0, recomputed_s=5.0, tokens=100)
    run = combine([first, second], gpus=2, usd_per_hour=None)
    assert run.attempts == 2 and run.wall_s == 80.0
    assert run.goodput == 0.5
    assert run.usd_per_work("tokens") is None
    assert "per billion" not in run.describe("tokens")


def test_steps_before_the_furthest_earlier_step_count_as_recomputed(tmp_path, monkeypatch):
    monkeypatch.setattr(startup, "launched_at", lambda: time.time())
    earlier = attempt(wall_s=20.0, productive_s=10.0, tokens=100)
    earlier.last_step = 7  # killed at step 7; the newest checkpoint was step 5
    (tmp_path / GOODPUT_FILE).write_text(json.dumps({"attempts": [earlier.__dict__]}))
    clock = GoodputClock(tmp_path, first_step=5, tokens_per_step=10, gpus=1, usd_per_hour=None)
    for step in (6, 7, 8):
        clock.begin_step()
        with clock.part("data_wait"):
            time.sleep(0.02)
        time.sleep(0.03)
        clock.end_step(step)
    a = clock.attempt
    assert a.tokens == 10  # step 8 only
    assert a.recomputed_s == pytest.approx(0.06, abs=0.05)
    assert a.productive_s == pytest.approx(0.03, abs=0.03)
    assert a.data_wait_s == pytest.approx(0.06, abs=0.05)
    clock.save()
    saved = json.loads((tmp_path / GOODPUT_FILE).read_text())
    assert [entry["last_step"] for entry in saved["attempts"]] == [7, 8]


@pytest.mark.parametrize("jump_s", [2 * 3600, -2 * 3600])
def test_a_step_of_the_wall_clock_changes_neither_the_wall_time_nor_the_cost(
    tmp_path, monkeypatch, jump_s
):
    """An NTP correction or a manual clock change of 2 hours while a job runs: the attempt's
    wall time (and so its GPU-hours, its cost and its span) keeps counting real seconds."""
    monkeypatch.setattr(startup, "launched_at", lambda: time.time() - 30.0)  # 30 s ago
    clock = GoodputClock(tmp_path, first_step=0, tokens_per_step=10, gpus=8, usd_per_hour=36.0)
    before = clock.attempt_report()
    real_time = time.time
    monkeypatch.setattr(time, "time", lambda: real_time() + jump_s)
    time.sleep(0.05)
    after = clock.attempt_report()
    assert 0.05 <= after.wall_s - before.wall_s < 1.0
    assert after.usd == pytest.approx(36.0 * after.wall_s / 3600)
    ((began, ended),) = clock.spans()
    assert ended - began == pytest.approx(after.wall_s, abs=0.5)
    clock.save()
    saved = json.loads((tmp_path / GOODPUT_FILE).read_text())["attempts"][0]
    assert 30.0 <= saved["wall_s"] < 32.0


def test_op_builds_are_taken_out_of_the_phase_they_happened_in(monkeypatch):
    monkeypatch.setattr(startup, "launched_at", lambda: 100.0)
    monkeypatch.setattr(startup, "_began", [("rendezvous", 110.0), ("engine build", 112.0)])
    monkeypatch.setattr(startup, "_op_builds", [(110.5, 111.5), (113.0, 116.0)])

    class Process:
        def create_time(self):
            return 102.0

    monkeypatch.setattr("psutil.Process", Process)
    assert startup.phase_durations(until=120.0) == {
        "launch": 2.0,
        "imports": 8.0,
        "rendezvous": 1.0,
        "engine build": 5.0,
        "op build": 4.0,
        "checkpoint load": 0.0,
    }


# ------------------------------------------------------------- a real job

STALL_S = 5.0
JOB = (*TINY, "train.steps=16", "checkpoint.every_steps=4", "logging.every_steps=4")


@pytest.fixture(scope="module")
def stalled_job(tmp_path_factory):
    """A 2-rank job whose rank 0 waits 5 s for its 10th batch; $10/h; timed from outside."""
    out = tmp_path_factory.mktemp("goodput")
    env = job_env(out, TRAIN_USD_PER_HOUR="10")
    env.update(fault_env("batch", at=10, action="pause", flag=out / "stalled", pause_s=STALL_S))
    began = time.time()
    job = run_job(out, *JOB, env=env)
    took = time.time() - began
    assert job.returncode == 0, job.stderr[-3000:]
    return job, took


@pytest.mark.multiprocess
def test_a_data_stall_is_reported_as_waiting_for_data(stalled_job):
    job, _ = stalled_job
    report = json.loads((job.output_dir / GOODPUT_FILE).read_text())["attempts"][0]
    assert STALL_S <= report["data_wait_s"] < STALL_S + 1.0
    assert report["productive_s"] < report["wall_s"] - STALL_S


@pytest.mark.multiprocess
def test_the_parts_add_up_to_the_wall_time_measured_from_outside(stalled_job):
    """Every part is timed on its own; what none of them covers ("other") stays under
    2 s and 10% of the wall time (a loaded 2-core machine stretches the untimed moments
    between parts as much as the parts), and the wall time is the job's, within 3 s."""
    job, took = stalled_job
    saved = json.loads((job.output_dir / GOODPUT_FILE).read_text())
    report = Attempt(**saved["attempts"][0])
    parts = sum(report.startup.values()) + report.productive_s + report.checkpoint_s
    parts += report.recomputed_s + report.evaluation_s + report.data_wait_s
    assert 0 <= report.wall_s - parts < min(2.0, 0.10 * report.wall_s)
    # The launcher's start is its process's create_time, which psutil adds to the boot time
    # of /proc/stat (whole seconds): up to a second either way of the clock the test reads.
    assert took - 3.0 < report.wall_s <= took + 1.0


@pytest.mark.multiprocess
def test_the_summary_line_reports_goodput_and_cost_per_billion_tokens(stalled_job):
    job, _ = stalled_job
    summary = job.stdout.strip().splitlines()[-1]
    goodput = float(re.search(r"goodput (\d+\.\d)%", summary).group(1))
    saved = json.loads((job.output_dir / GOODPUT_FILE).read_text())["run"]
    assert goodput == pytest.approx(100 * saved["goodput"], abs=0.1)
    price = float(re.search(r"\$([\d,.]+) per billion tokens", summary).group(1).replace(",", ""))
    # $10/h over the wall time, per billion tokens of the 16 steps (2 ranks x 4 x 32 tokens).
    expected = 10 * saved["wall_s"] / 3600 / (16 * 2 * 4 * 32) * 1e9
    assert price == pytest.approx(expected, rel=0.01)
    last = read_metrics(job.output_dir)[-1]
    assert last["data_wait_s"] >= STALL_S and 0 < last["goodput"] < 1


@pytest.mark.multiprocess
def test_start_up_says_each_phase_as_it_begins_and_keeps_library_warnings_in_the_log(
    stalled_job,
):
    job, _ = stalled_job
    said = re.findall(r"\[(?:launcher|rank 0)\] start-up: ([a-z ]+):", job.stderr)
    phases = [p for p in said if p != "op build"]  # only when DeepSpeed loads a JIT op
    # The checkpoint is chosen before the engine is built (it may need a universal load),
    # and loaded into it after.
    assert phases == [
        "launch", "imports", "rendezvous", "checkpoint load", "engine build", "checkpoint load"
    ]  # fmt: skip
    log = (job.output_dir / "logs" / "rank0.log").read_text()
    library_warnings = re.findall(r"WARNING (?:DeepSpeed|py\.warnings): (.*)", log)
    assert library_warnings  # DeepSpeed says which accelerator it picked, at least
    for warning in library_warnings:
        assert warning not in job.stderr + job.stdout
