#!/usr/bin/env python3
# The node's job watcher: runs the jobs of the stack's job spool (infra/jobs/spool.py), one
# at a time, in the training container. run-training.sh starts it once the driver, the
# image and the health gate are good.
# Policy, one rule: the newest job takes the GPUs. A job is as new as its job.json (`run`
# writes it, `up` the default job's; within one second of S3's clock, the spec's
# submitted_at decides). The newest job waiting (queued, yielded, or running when the node
# stopped) runs; a newer one arriving stops it (docker stop: it checkpoints, exits 75 and is
# marked yielded, to resume once it is the newest again); an older one waits its turn. A
# cancel request stops a running job the same way and marks it cancelled.
# A job's fault never ends the watcher: a crash (any exit but 0, 2 and a 75 it asked for:
# a failed worker, a hang, a kill) starts the job again, at most CRASH_RESTARTS times in
# CRASH_WINDOW_S (training/contract.py, the Slurm batch script's bound too), then fails
# it; bad configuration (2) fails it at once. Its state object then says why: the last line
# of its output that starts with the trainer's error or failure prefix. A spool object that
# is not a job (a job.json that does not parse, a stray key, a state no node writes) is
# skipped; a job.json that is not a job is marked failed, saying so.
# With no job to run for IDLE_STOP_S (an empty spool too) it stops the node.
# The host's python3 (cloud-init's own interpreter) and the aws CLI: no other package.
# Each job's folder (its config and env file) is under the state folder, which the
# container mounts at the same path (run-training.sh).
# Rendered by infra/node/boot.py, which fills in the placeholders.
import collections
import datetime
import json
import os
import re
import subprocess
import sys
import threading
import time

SPOOL_URI = "@@spool_uri@@"
CHECKPOINT_URI = "@@checkpoint_uri@@"
REGION = "@@region@@"
JOBS_DIR = "@@jobs_dir@@"
CHECKPOINT_ROOT, OUTPUT_ROOT = "@@checkpoint_root@@", "@@output_root@@"
POLL_S, IDLE_STOP_S = float("@@poll_s@@"), float("@@idle_stop_s@@")
SPEC, CANCEL, STATE, CODE = str.split("@@spool_names@@")
QUEUED, RUNNING, YIELDED, DONE, CANCELLED, FAILED = str.split("@@job_states@@")
WAITING = (QUEUED, RUNNING, YIELDED)
JOB_NAME = re.compile("@@job_name_pattern@@")
EXIT_BAD_CONFIG, EXIT_INTERRUPTED = int("@@exit_bad_config@@"), int("@@exit_interrupted@@")
CRASH_RESTARTS, CRASH_WINDOW_S = int("@@crash_restarts@@"), float("@@crash_window_s@@")
# The trainer's first words on the line that says why a job ended badly.
REASONS = tuple(word + " " for word in str.split("@@reason_prefixes@@"))
CODE_URI_ENV = "@@code_uri_env@@"
JOB_LOG_STREAM_PREFIX = "@@job_log_stream_prefix@@"
HF_TOKEN_SECRET, HF_TOKEN_ENV = "@@hf_token_secret@@", "@@hf_token_env@@"
# run-training.sh passes the image, then its `docker run` options.
IMAGE_URI, DOCKER_OPTIONS = sys.argv[1], sys.argv[2:]
# s3://bucket/jobs: keys start with jobs/
KEY_PREFIX = SPOOL_URI.split("/", 3)[3] + "/"


def log(message):
    print("gpu-stack:", message, flush=True)


def aws(*args, text=""):
    argv = ["aws", *args, "--region", REGION]
    run = subprocess.run(argv, input=text, capture_output=True, text=True, errors="replace")
    if run.returncode:
        raise subprocess.CalledProcessError(run.returncode, argv, run.stdout, run.stderr)
    return run.stdout


# name -> the jobs of the spool, newest first; each object is read once per version (time,
# size); CalledProcessError when S3 cannot be read.
def read_spool(cache, told):
    try:
        lines = aws("s3", "ls", f"{SPOOL_URI}/", "--recursive").splitlines()
    except subprocess.CalledProcessError as error:
        # `aws s3 ls` exits 1, saying nothing, when nothing matches: an empty spool.
        if error.returncode != 1 or error.stdout.strip() or error.stderr.strip():
            raise
        lines = []
    leaves = {}
    for line in lines:
        day, clock, size, key = [*line.split(None, 3), "", "", "", ""][:4]
        name, _, leaf = key[len(KEY_PREFIX) :].partition("/")
        if JOB_NAME.fullmatch(name) and leaf in (SPEC, CANCEL, STATE, CODE):
            leaves.setdefault(name, {})[leaf] = (f"{day} {clock}", size)
        elif key not in told:
            told.add(key)
            log(f"{key or line}: not part of a job: skipped")

    def read(name, leaf, parse):
        version = (name, leaf, *leaves[name][leaf])
        if version not in cache:
            cache[version] = parse(aws("s3", "cp", f"{SPOOL_URI}/{name}/{leaf}", "-"))
        return cache[version]

    jobs = {}
    for name, versions in leaves.items():
        if SPEC not in versions:
            continue  # being submitted: its code is there, its job.json not yet
        job = Job(name, versions[SPEC][0], *read(name, SPEC, parse_spec), CANCEL in versions)
        # A job.json newer than the node's word is a job sent again: queued.
        if STATE in versions and not versions[SPEC][0] > versions[STATE][0]:
            word, _, reason = read(name, STATE, lambda text: text.partition("\n"))
            job.state, job.reason = word.strip(), reason.strip()
        jobs[name] = job
    return dict(sorted(jobs.items(), key=lambda item: item[1].newness, reverse=True))


class Job:
    def __init__(self, name, spec_at, spec, problem, cancel):
        self.name, self.spec, self.problem, self.cancel = name, spec, problem, cancel
        self.state, self.reason = QUEUED, ""
        # When its job.json was written (S3's clock, to the second), then its submitted_at.
        self.newness = (spec_at, spec["submitted_at"] if spec else datetime.datetime.min)

    def runnable(self):
        return self.state in WAITING and not self.cancel and self.spec is not None


# (what the node needs of a job.json, None), or (None, why it is not a job).
def parse_spec(text):
    try:
        spec = json.loads(text)
        for key, kind in (("config_toml", str), ("overrides", list), ("usd_per_hour", float)):
            if not isinstance(spec[key], (kind, int) if kind is float else kind):
                raise ValueError(f"{key} is not a {kind.__name__}")
        spec["overrides"] = [str(override) for override in spec["overrides"]]
        stamp = spec["submitted_at"].replace("Z", "+00:00")
        spec["submitted_at"] = datetime.datetime.fromisoformat(stamp).replace(tzinfo=None)
        spec["has_code"] = spec.get("has_code") is True
        # A command job (infra/jobs/spool.py, JobSpec.command): `python -m training exec`.
        spec["command"] = [str(part) for part in spec.get("command") or []]
    # Any object at all: not JSON, too deep, a key missing or of another type.
    except Exception as error:
        return None, f"{SPEC} is not a job: {type(error).__name__}: {' '.join(str(error).split())}"
    return spec, None


# Write the node's word on a job, and why; False (said) when S3 could not take it.
def set_state(name, state, reason=""):
    body = f"{state}\n{reason[:1000]}\n" if reason else f"{state}\n"
    try:
        aws("s3", "cp", "--only-show-errors", "-", f"{SPOOL_URI}/{name}/{STATE}", text=body)
    except subprocess.CalledProcessError as error:
        log(f"could not mark job {name} {state}: {error.stderr.strip()}")
        return False
    log(f"job {name}: {state}" + (f" ({reason})" if reason else ""))
    return True


# The stack's Hugging Face token (`up` and `run` store the user's HF_TOKEN as its secret),
# read at each job's start: a token stored since the last job counts. "" when none is
# stored. The token goes nowhere but into the container's environment.
def hf_token():
    if not HF_TOKEN_SECRET:
        return ""
    read = ("secretsmanager", "get-secret-value", "--secret-id", HF_TOKEN_SECRET)
    try:
        return aws(*read, "--query", "SecretString", "--output", "text").rstrip("\n")
    except subprocess.CalledProcessError as error:
        if "ResourceNotFoundException" not in error.stderr:
            log(f"could not read {HF_TOKEN_SECRET} ({error.stderr.strip()}): no {HF_TOKEN_ENV}")
        return ""


# One job's `docker run`: its output passes through, and the last line that says why it
# ended badly is kept. A container that cannot start (a full disk) is a crash like any.
class Container:
    def __init__(self, name, spec):
        self.name, self.reason, self.process = name, "", None
        try:
            self.process = self.start(spec)
        except OSError as error:
            self.reason = f"could not start its container: {error}"
            return
        self.reader = threading.Thread(target=self.pass_output, daemon=True)
        self.reader.start()

    def start(self, spec):
        name, folder = self.name, f"{JOBS_DIR}/{self.name}"
        os.makedirs(folder, exist_ok=True)
        with open(f"{folder}/train.toml", "w") as file:
            file.write(spec["config_toml"])
        env = {
            "TRAIN_CONFIG": f"{folder}/train.toml",
            "TRAIN_S3_URI": f"{CHECKPOINT_URI}/{name}",
            "TRAIN_CHECKPOINT_DIR": f"{CHECKPOINT_ROOT}/{name}",
            "TRAIN_OUTPUT_DIR": f"{OUTPUT_ROOT}/{name}",
            "TRAIN_USD_PER_HOUR": f"{spec['usd_per_hour']:.4f}",
        }
        if spec["has_code"]:
            env[CODE_URI_ENV] = f"{SPOOL_URI}/{name}/{CODE}"
        with open(f"{folder}/job.env", "w") as file:
            file.writelines(f"{key}={value}\n" for key, value in env.items())
        if spec["command"]:
            arguments = ["exec", "--", *spec["command"]]
        else:
            arguments = [part for override in spec["overrides"] for part in ("--set", override)]
        # The job's output goes to a log stream of its own (`logs --job NAME`), not node-0's.
        stream = f"awslogs-stream={JOB_LOG_STREAM_PREFIX}{name}"
        docker = [stream if o.startswith("awslogs-stream=") else o for o in DOCKER_OPTIONS]
        options = [*docker, "--env-file", f"{folder}/job.env"]
        # `--env NAME` alone: docker takes the value from its own environment, so the token
        # is on no command line (docs.docker.com/reference/cli/docker/container/run/#env).
        environ, token = dict(os.environ), hf_token()
        if token:
            environ[HF_TOKEN_ENV] = token
            options += ["--env", HF_TOKEN_ENV]
        command = ["docker", "run", *options, IMAGE_URI, "python", "-m", "training", *arguments]
        return subprocess.Popen(
            command, env=environ, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )

    def pass_output(self):
        for raw in self.process.stdout:
            sys.stdout.buffer.write(raw)
            sys.stdout.flush()
            line = raw.decode(errors="replace").strip()
            if line.startswith(REASONS):
                self.reason = line.split(" ", 1)[1]

    # None while it runs, then its exit status (125, docker run's own, if it never ran).
    def exit_status(self):
        status = 125 if self.process is None else self.process.poll()
        if self.process is not None and status is not None:
            self.reader.join(timeout=10)
        return status


# The job's state once its container exited with `status`, and why; None: start it again
# (a crash within the bound).
def outcome(container, status, ending, crashes):
    said = container.reason
    if status == 0:
        return DONE, ""
    if status == EXIT_INTERRUPTED and ending is not None:
        return ending, ""
    if status == EXIT_BAD_CONFIG:
        return FAILED, said or f"exit {status}"
    now, hours = time.monotonic(), f"{CRASH_WINDOW_S / 3600:g} h"
    crashes[container.name] = [t for t in crashes[container.name] if now - t < CRASH_WINDOW_S]
    crashes[container.name].append(now)
    count = len(crashes[container.name])
    if count <= CRASH_RESTARTS:
        log(f"job {container.name}: starting it again ({count} of {CRASH_RESTARTS} in {hours})")
        return None
    started = f"exit {status}, {count} starts within {hours}"
    return FAILED, f"{said} ({started})" if said else started


# Why the running job `name` must stop now (cancelled, yielded), or None.
def stop_reason(name, jobs):
    job = jobs.get(name)
    if job is None or job.cancel or job.state not in WAITING:
        return CANCELLED
    # Sent again: it starts over from its new job.json.
    if job.state == QUEUED or job.spec is None:
        return YIELDED
    if any(other.runnable() and other.newness > job.newness for other in jobs.values()):
        return YIELDED
    return None


# What needs no container: a job.json that is not a job fails, a cancel request for a job
# not running ends it, a state no node writes is reported (and the job never runs).
def tidy(job, told):
    if job.spec is None and job.state in WAITING:
        if set_state(job.name, FAILED, job.problem):
            job.state = FAILED
    elif job.cancel and job.state in WAITING:
        if set_state(job.name, CANCELLED):
            job.state = CANCELLED
    elif job.state not in (*WAITING, DONE, CANCELLED, FAILED) and job.name not in told:
        told.add(job.name)
        log(f"job {job.name}: unknown state {job.state!r}: skipped")


def main():
    cache, told = {}, set()
    # name -> monotonic times of its crashes
    crashes = collections.defaultdict(list)
    # (name, Container, the state it is being stopped for or None)
    current = None
    # (name, state, reason) of the job that ended, until S3 has it
    finished = None
    idle_since = time.monotonic()
    while True:
        if finished is not None:
            if not set_state(*finished):
                time.sleep(POLL_S)
                continue
            finished = None
        try:
            jobs = read_spool(cache, told)
        except subprocess.CalledProcessError as error:
            # S3 out of reach a moment: a running job goes on, and an idle node stays idle.
            log(f"could not read the job spool: {error.stderr.strip()}")
            jobs = {}
        for job in jobs.values():
            if current is None or job.name != current[0]:
                tidy(job, told)
        if current is not None:
            name, container, ending = current
            status = container.exit_status()
            if status is None:
                ending = ending or (stop_reason(name, jobs) if jobs else None)
                if ending is not None and current[2] is None:
                    current = (name, container, ending)
                    log(f"job {name}: checkpoint and stop ({ending})")
                    subprocess.run(["docker", "stop", "--time", "100", "gpu-training"])
                time.sleep(POLL_S)
                continue
            log(f"job {name}: exit {status}")
            current, idle_since = None, time.monotonic()
            finished = outcome(container, status, ending, crashes)
            if finished is not None:
                finished = (name, *finished)
                continue
            # A crash: started again at the next poll, if it is still the newest.
            time.sleep(POLL_S)
            continue
        ready = [job for job in jobs.values() if job.runnable()]
        if ready:
            # Jobs left running when the node stopped, older than this one, wait their turn.
            for other in ready[1:]:
                if other.state == RUNNING and set_state(other.name, YIELDED):
                    other.state = YIELDED
            if set_state(ready[0].name, RUNNING):
                current = (ready[0].name, Container(ready[0].name, ready[0].spec), None)
                continue
        elif time.monotonic() - idle_since >= IDLE_STOP_S:
            log("no job left: stopping this node")
            subprocess.run(["shutdown", "-h", "+1", "gpu-stack: no job"], check=False)
            return 0
        time.sleep(POLL_S)


if __name__ == "__main__":
    sys.exit(main())
