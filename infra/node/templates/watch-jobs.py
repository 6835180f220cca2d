#!/usr/bin/env python3
# The node's job watcher: runs the jobs of the stack's job spool (infra/jobs/spool.py), one
# at a time, in the training container. run-training.sh starts it once the driver, the
# image and the health gate are good.
# Policy: a job submitted while another runs takes the GPUs: the running one gets SIGTERM
# (docker stop), checkpoints, exits 75 and is marked yielded; it resumes from that
# checkpoint once no newer job waits. A cancel request stops a running job the same way
# and marks it cancelled. A job the spool no longer holds is stopped too.
# Exit codes reach systemd (gpu-training.service): 75 when the container was interrupted
# from outside (a spot stop, systemctl stop; the job stays running and resumes first), the
# container's own status when it failed (systemd restarts the watcher, within its limit).
# The host's python3 (cloud-init's own interpreter) and the aws CLI: no other package.
# Each job's folder (its config and env file) is under the state folder, which the
# container mounts at the same path (run-training.sh).
# Rendered by infra/node/boot.py, which fills in the placeholders.
import json
import os
import subprocess
import sys
import time

SPOOL_URI = "@@spool_uri@@"
CHECKPOINT_URI = "@@checkpoint_uri@@"
REGION = "@@region@@"
JOBS_DIR = "@@jobs_dir@@"
CHECKPOINT_ROOT, OUTPUT_ROOT = "@@checkpoint_root@@", "@@output_root@@"
POLL_S, IDLE_STOP_S = float("@@poll_s@@"), float("@@idle_stop_s@@")
SPEC, CANCEL, STATE, CODE = str.split("@@spool_names@@")
QUEUED, RUNNING, YIELDED, DONE, CANCELLED, FAILED = str.split("@@job_states@@")
EXIT_BAD_CONFIG, EXIT_INTERRUPTED = int("@@exit_bad_config@@"), int("@@exit_interrupted@@")
CODE_URI_ENV = "@@code_uri_env@@"
JOB_LOG_STREAM_PREFIX = "@@job_log_stream_prefix@@"
# run-training.sh passes the image, then its `docker run` options.
IMAGE_URI, DOCKER_OPTIONS = sys.argv[1], sys.argv[2:]


def log(message):
    print("gpu-stack:", message, flush=True)


def aws(*args, text=""):
    argv = ["aws", *args, "--region", REGION]
    return subprocess.run(argv, input=text, capture_output=True, text=True, check=True).stdout


def read(name, leaf):
    return aws("s3", "cp", f"{SPOOL_URI}/{name}/{leaf}", "-")


def set_state(name, state):
    aws("s3", "cp", "--only-show-errors", "-", f"{SPOOL_URI}/{name}/{STATE}", text=state + "\n")
    log(f"job {name}: {state}")


# name -> (state, submitted, cancel asked); a job.json newer than its state is queued again.
def spool():
    leaves = {}
    for line in aws("s3", "ls", f"{SPOOL_URI}/", "--recursive").splitlines():
        day, clock, _size, key = line.split(None, 3)
        _, name, leaf = key.rsplit("/", 2)
        leaves.setdefault(name, {})[leaf] = f"{day} {clock}"
    jobs = {}
    for name, times in leaves.items():
        if SPEC not in times:
            continue
        state = QUEUED
        if STATE in times and not times[SPEC] > times[STATE]:
            state = read(name, STATE).strip()
        jobs[name] = (state, times[SPEC], CANCEL in times)
    return jobs


# The jobs in `state` not asked to cancel, newest submission first.
def waiting(jobs, state):
    found = [(when, name) for name, (s, when, cancel) in jobs.items() if s == state and not cancel]
    return [name for _, name in sorted(found, reverse=True)]


def start(name):
    spec = json.loads(read(name, SPEC))
    folder = f"{JOBS_DIR}/{name}"
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
    overrides = [part for override in spec["overrides"] for part in ("--set", override)]
    set_state(name, RUNNING)
    # The job's output goes to a log stream of its own (`logs --job NAME`), not node-0's.
    stream = f"awslogs-stream={JOB_LOG_STREAM_PREFIX}{name}"
    docker = [stream if o.startswith("awslogs-stream=") else o for o in DOCKER_OPTIONS]
    options = [*docker, "--env-file", f"{folder}/job.env", IMAGE_URI]
    return subprocess.Popen(["docker", "run", *options, "python", "-m", "training", *overrides])


def main():
    current, container, ending, idle = None, None, None, time.monotonic()
    while True:
        try:
            jobs = spool()
        except subprocess.CalledProcessError as error:
            # S3 out of reach a moment: the running job goes on; ask again next poll.
            log(f"could not read the job spool: {error.stderr.strip()}")
            time.sleep(POLL_S)
            continue
        for name, (state, _, cancel) in jobs.items():
            if cancel and state in (QUEUED, YIELDED, RUNNING) and name != current:
                set_state(name, CANCELLED)
        if current is not None:
            if container.poll() is None and ending is None:
                state, _, cancel = jobs.get(current, (None, None, True))
                if cancel:
                    ending = CANCELLED
                elif waiting(jobs, QUEUED):
                    ending = YIELDED
                if ending is not None:
                    log(f"job {current}: checkpoint and stop ({ending})")
                    subprocess.run(["docker", "stop", "--time", "100", "gpu-training"], check=False)
            if container.poll() is None:
                time.sleep(POLL_S)
                continue
            status = container.returncode
            log(f"job {current}: exit {status}")
            if status == 0:
                set_state(current, DONE)
            elif status == EXIT_INTERRUPTED and ending is not None:
                set_state(current, ending)
            elif status == EXIT_BAD_CONFIG:
                set_state(current, FAILED)
            else:
                return status
            current, container, ending, idle = None, None, None, time.monotonic()
            continue
        ready = waiting(jobs, QUEUED) + waiting(jobs, RUNNING) + waiting(jobs, YIELDED)
        if ready:
            current = ready[0]
            container = start(current)
            continue
        if time.monotonic() - idle >= IDLE_STOP_S:
            log("no job left: stopping this node")
            subprocess.run(["shutdown", "-h", "+1", "gpu-stack: no job"], check=False)
            return 0
        time.sleep(POLL_S)


if __name__ == "__main__":
    sys.exit(main())
