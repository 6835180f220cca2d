"""The local stack (infra/targets/local.py): the daily loop on this machine, through the
commands themselves, with real jobs run by the real runner (infra/node/local_job.py).

A command job (`run local -- COMMAND`, a small script that saves on SIGTERM) shows the
loop's mechanics in seconds; one trainer job shows the bar: `run` starts it here, `jobs`
lists it, `cancel` stops it with a checkpoint, and `run` again resumes from that checkpoint.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from infra.commands import cancel, down, jobs, logs, start, status, stop, up
from infra.commands import run as run_job
from infra.errors import ConfigError
from infra.jobs.spool import JobState
from infra.node import local_job
from infra.targets.local import ROOT_ENV
from training.contract import ExitCode

STACK = "local"
# Saves on SIGTERM as a user's script should: it writes its step, says so and exits 75.
SCRIPT = """\
import os, signal, sys, time
folder = os.environ["CHECKPOINT_DIR"]
saved = os.path.join(folder, "step")
step = int(open(saved).read()) if os.path.exists(saved) else 0
print(f"resumed at {step}" if step else "fresh start", flush=True)
def save(*_):
    open(saved, "w").write(str(step))
    print(f"saved step {step}", flush=True)
    sys.exit(75)
signal.signal(signal.SIGTERM, save)
while step < int(sys.argv[1]):
    step += 1
    time.sleep(0.05)
print("done", flush=True)
"""


@pytest.fixture
def stack_home(tmp_path, monkeypatch):
    monkeypatch.setenv(ROOT_ENV, str(tmp_path / "stack"))
    yield tmp_path / "stack" / "jobs"
    # A failed test leaves no job running: each runner leads a session of its own.
    for pid in (tmp_path / "stack").glob(f"jobs/*/{local_job.PID}"):
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.killpg(int(pid.read_text()), signal.SIGKILL)


def command_job(tmp_path: Path, name: str, steps: int, *command: str) -> argparse.Namespace:
    """`run local [--code lab] --name NAME -- COMMAND`: SCRIPT shipped in --code by default."""
    code = None
    if not command:  # the script travels as the job's code, and runs from its folder
        code = tmp_path / "lab"
        code.mkdir(exist_ok=True)
        (code / "job.py").write_text(SCRIPT)
        command = (sys.executable, "job.py", str(steps))
    return argparse.Namespace(
        stack=STACK, config=None, code=code, name=name, overrides=[], job_command=command
    )


def wait_for(predicate, seconds: float = 60, what: str = ""):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(0.2)
    raise AssertionError(f"not within {seconds} s: {what}")


def state(stack_home: Path, job: str) -> str:
    return (stack_home / job / local_job.STATE).read_text().split("\n")[0]


def log_text(stack_home: Path, job: str) -> str:
    return (stack_home / job / local_job.LOG).read_text()


@pytest.mark.multiprocess
def test_a_command_job_is_cancelled_with_its_save_and_resumes_from_it(tmp_path, stack_home):
    said = run_job.run(command_job(tmp_path, "sweep", 100_000))
    assert said.startswith("job sweep started on local.")
    wait_for(lambda: "fresh start" in log_text(stack_home, "sweep"), what="the job's first line")
    listed = jobs.run(argparse.Namespace(stack=STACK)).splitlines()
    assert listed[1].split()[:2] == ["sweep", "running"]
    # One job at a time, as on a single node: a second is refused and names the one to cancel.
    with pytest.raises(ConfigError, match=r"job sweep is running on local.*cancel local sweep"):
        run_job.run(command_job(tmp_path, "other", 10))

    said = cancel.run(argparse.Namespace(stack=STACK, job="sweep"))
    saved = int((stack_home / "sweep" / local_job.CHECKPOINTS / "step").read_text())
    assert saved > 0
    kept = stack_home / "sweep" / local_job.CHECKPOINTS
    assert said == f"job sweep cancelled: stopped; its saves stay in {kept}"
    assert state(stack_home, "sweep") == JobState.CANCELLED

    said = run_job.run(command_job(tmp_path, "sweep", saved + 20))
    assert said.startswith("job sweep was cancelled: it resumes from its last checkpoint on local")
    wait_for(lambda: state(stack_home, "sweep") == JobState.DONE, what="the resumed job's end")
    assert f"resumed at {saved}" in log_text(stack_home, "sweep")

    out = io.StringIO()
    asked = argparse.Namespace(stack=STACK, job="sweep", node=None, since=5, follow=False)
    logs.run(asked, out=out)
    lines = out.getvalue().splitlines()
    # Each line as a rented stack prints it: the job's stream, the time, the line.
    assert [line.split("  ", 2)[2] for line in lines if "saved step" in line] == [
        f"saved step {saved}"
    ]
    assert all(line.startswith("job-sweep  ") for line in lines)
    assert lines[-1].endswith(f"gpu-stack: job sweep: exit {ExitCode.DONE}")


@pytest.mark.multiprocess
def test_stop_checkpoints_the_running_job_and_start_resumes_it(tmp_path, stack_home):
    run_job.run(command_job(tmp_path, "sweep", 100_000))
    wait_for(lambda: "fresh start" in log_text(stack_home, "sweep"), what="the job's first line")
    said = stop.run(argparse.Namespace(stack=STACK), out=io.StringIO())
    assert said == "stopped sweep on local, checkpointed; `python -m infra start local` resumes it"
    assert state(stack_home, "sweep") == JobState.YIELDED
    assert stop.run(argparse.Namespace(stack=STACK), out=io.StringIO()) == (
        "no job is running on local: nothing to stop"
    )
    said = start.run(argparse.Namespace(stack=STACK), out=io.StringIO())
    assert said.startswith("job sweep resumes on local")
    wait_for(lambda: "resumed at" in log_text(stack_home, "sweep"), what="the resumed start")
    report = status.run(argparse.Namespace(stack=STACK, watch=None))
    assert report.splitlines()[0].endswith("nothing rented ($0.00/h)")
    assert report.splitlines()[5].split()[:2] == ["sweep", "running"]

    # down: the running job saves, nothing bills; its data stays unless asked.
    out = io.StringIO()
    said = down.run(argparse.Namespace(stack=STACK, yes=True, delete_data=False), out=out)
    assert said.splitlines()[0] == "stack local: no job runs; nothing was rented, so nothing bills"
    assert "saved step" in log_text(stack_home, "sweep").split("resumed at")[1]
    assert state(stack_home, "sweep") == JobState.YIELDED
    said = down.run(argparse.Namespace(stack=STACK, yes=True, delete_data=True), out=out)
    assert said.splitlines()[1] == f"deleted 1 job(s) and their checkpoints from {stack_home}"
    assert not stack_home.exists()


@pytest.mark.multiprocess
def test_a_stop_sent_to_the_runner_itself_is_not_taken_for_a_crash(tmp_path, stack_home):
    run_job.run(command_job(tmp_path, "sweep", 100_000))
    wait_for(lambda: "fresh start" in log_text(stack_home, "sweep"), what="the job's first line")
    os.kill(int((stack_home / "sweep" / local_job.PID).read_text()), signal.SIGTERM)
    wait_for(lambda: state(stack_home, "sweep") != JobState.RUNNING, what="the stop")
    assert state(stack_home, "sweep") == JobState.YIELDED
    log = log_text(stack_home, "sweep")
    assert "saved step" in log and log.count("fresh start") == 1  # saved, not started again


# `docker run` as the image would run the job, played by this interpreter: only the
# environment the container gets (its --env-file and --env names), in its --workdir.
DOCKER = """\
#!{python}
import json, os, sys
args = sys.argv[1:]
with open(os.environ["DOCKER_CALLS"], "a") as calls:
    calls.write(json.dumps(args) + "\\n")
env, options, at = {{}}, {{}}, 1
while args[at].startswith("-"):
    if args[at] == "--env":
        env[args[at + 1]] = os.environ[args[at + 1]]
        at += 2
        continue
    key, _, value = args[at].partition("=")
    options[key], at = value, at + 1
for line in open(options["--env-file"]):
    key, _, value = line.rstrip("\\n").partition("=")
    env[key] = value
os.chdir(options["--workdir"])
env.update(PATH=os.environ["PATH"], PYTHONPATH={repo!r})
os.execve(sys.executable, [sys.executable, *args[at + 2 :]], env)
"""


@pytest.mark.multiprocess
def test_with_an_image_named_the_job_runs_in_it_with_the_gpus(tmp_path, stack_home, monkeypatch):
    tools = tmp_path / "bin"
    tools.mkdir()
    repo = str(Path(__file__).resolve().parents[3])
    (tools / "docker").write_text(DOCKER.format(python=sys.executable, repo=repo))
    (tools / "nvidia-smi").write_text(
        "#!/bin/sh\necho 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)'\n"
    )
    for tool in tools.iterdir():
        tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tools}:{os.environ['PATH']}")
    monkeypatch.setenv("DOCKER_CALLS", str(tmp_path / "calls"))
    monkeypatch.setenv("GPU_STACK_LOCAL_IMAGE", "gpu-training:cu130-test")
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    probe = (
        "import os; print('cache', os.environ['TRAIN_CACHE_DIR'], 'token', os.environ['HF_TOKEN'])"
    )
    run_job.run(command_job(tmp_path, "boxed", 0, sys.executable, "-c", probe))
    wait_for(lambda: state(stack_home, "boxed") == JobState.DONE, what="the job's end")

    folder = stack_home / "boxed"
    assert f"cache {folder}/cache token hf_secret" in log_text(stack_home, "boxed")
    (args,) = [json.loads(line) for line in (tmp_path / "calls").read_text().splitlines()]
    assert args[0] == "run" and "--gpus=all" in args and f"--volume={folder}:{folder}" in args
    image_at = args.index("gpu-training:cu130-test")
    assert args[image_at + 1 :] == [
        "python",
        "-m",
        "training",
        "exec",
        "--",
        sys.executable,
        "-c",
        probe,
    ]
    # The token passes by name: no command line carries it.
    assert args[args.index("--env") + 1] == "HF_TOKEN" and "hf_secret" not in " ".join(args)


@pytest.mark.multiprocess
def test_a_job_the_trainer_refuses_fails_with_its_reason_and_is_not_started_again(
    tmp_path, stack_home, monkeypatch
):
    # Typed in a folder of the user's: the job's relative paths start there, as they would.
    monkeypatch.chdir(tmp_path)
    refuse = "import os; print('error: data.path not found from', os.getcwd()); raise SystemExit(2)"
    run_job.run(command_job(tmp_path, "bad", 0, sys.executable, "-c", refuse))
    wait_for(lambda: state(stack_home, "bad") == JobState.FAILED, what="the job's failure")
    listed = jobs.run(argparse.Namespace(stack=STACK))
    assert listed.splitlines()[-1] == f"job bad failed: data.path not found from {tmp_path}"
    assert log_text(stack_home, "bad").count("gpu-stack: job bad: exit") == 1


@pytest.mark.multiprocess
def test_a_crash_starts_the_job_again_until_the_crash_bound(tmp_path, stack_home):
    crashing = (sys.executable, "-c", "print('failed: rank 1 out of memory'); raise SystemExit(1)")
    run_job.run(command_job(tmp_path, "crash", 0, *crashing))
    wait_for(lambda: state(stack_home, "crash") == JobState.FAILED, what="the last crash")
    starts = log_text(stack_home, "crash").count("gpu-stack: job crash: exit 1")
    assert starts == 4  # the first start and CRASH_RESTARTS (3) more, as on a node
    reason = (stack_home / "crash" / local_job.STATE).read_text().split("\n")[1]
    assert reason == "rank 1 out of memory (exit 1, 4 starts within 6 h)"


def test_the_local_stack_has_nothing_to_create_and_refuses_bad_names(
    stack_home, tmp_path, monkeypatch
):
    with pytest.raises(ConfigError, match="stack local is this machine: it has no stack file"):
        up.run(argparse.Namespace(stack=STACK, yes=True, policy_pack=False))
    with pytest.raises(ConfigError, match="no job 'nope' on local"):
        cancel.run(argparse.Namespace(stack=STACK, job="nope"))
    with pytest.raises(ConfigError, match="stack local is one node, node 0"):
        logs.run(argparse.Namespace(stack=STACK, job=None, node=1, since=5, follow=False))
    assert jobs.run(argparse.Namespace(stack=STACK)).startswith("no job on local: start one")
    # A folder that cannot be written is one line naming it and the fix; nothing starts.
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv(ROOT_ENV, str(blocker))
    with pytest.raises(ConfigError, match=f"cannot write the job's folder {blocker}/jobs/x"):
        run_job.run(command_job(tmp_path, "x", 0, "true"))
    # An image named with no docker to run it is refused, not quietly run without it.
    monkeypatch.setenv("GPU_STACK_LOCAL_IMAGE", "gpu-training:cu130")
    monkeypatch.setenv("PATH", str(tmp_path / "no-tools"))
    with pytest.raises(ConfigError, match="docker is not on PATH to run it: install Docker, or"):
        run_job.run(command_job(tmp_path, "x", 0, "true"))


TRAINER_JOB = """\
[model]
preset = "tiny"
[data]
kind = "synthetic"
seq_len = 32
vocab_size = 64
[train]
steps = {steps}
micro_batch_size = 4
[scheduler]
kind = "constant"
[zero]
stage = 1
[checkpoint]
every_steps = 100000
[logging]
every_steps = 1
progress_bar = false
"""


@pytest.mark.multiprocess
@pytest.mark.slow(reason="two starts of a real trainer job on this machine", seconds=90)
def test_a_trainer_job_cancelled_with_a_checkpoint_resumes_when_run_again(
    tmp_path, stack_home, monkeypatch
):
    monkeypatch.setenv("TRAIN_NPROC_PER_NODE", "1")
    config = tmp_path / "tiny.toml"
    config.write_text(TRAINER_JOB.format(steps=100_000))
    args = argparse.Namespace(
        stack=STACK, config=config, code=None, name=None, overrides=[], job_command=()
    )
    assert run_job.run(args).startswith("job tiny started on local.")
    status_file = stack_home / "tiny" / local_job.OUTPUT / "status.json"
    wait_for(status_file.is_file, seconds=120, what="the trainer's first status")
    listed = jobs.run(argparse.Namespace(stack=STACK)).splitlines()
    assert listed[1].split()[:2] == ["tiny", "running"]

    said = cancel.run(argparse.Namespace(stack=STACK, job="tiny"))
    stopped = json.loads(status_file.read_text())
    assert stopped["state"] == "interrupted"
    tag = (stack_home / "tiny" / local_job.CHECKPOINTS / "latest_committed").read_text().strip()
    assert tag == f"step_{stopped['step']:08d}"
    assert said == f"job tiny cancelled: stopped at step {stopped['step']:,}; checkpoint {tag}"

    # Run again, to a few steps past the checkpoint: it resumes there, and ends done.
    config.write_text(TRAINER_JOB.format(steps=stopped["step"] + 3))
    assert "it resumes from its last checkpoint" in run_job.run(args)
    wait_for(lambda: state(stack_home, "tiny") != JobState.RUNNING, seconds=120, what="the end")
    assert state(stack_home, "tiny") == JobState.DONE
    metrics = stack_home / "tiny" / local_job.OUTPUT / "metrics.jsonl"
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [r["step"] for r in records if "loss" in r][-3:] == [
        stopped["step"] + 1,
        stopped["step"] + 2,
        stopped["step"] + 3,
    ]
    assert json.loads(status_file.read_text())["state"] == "done"
