"""A node's boot, as systemd runs the rendered unit, on a simulated host.

The host is a temporary root holding every file the user data writes, with stand-ins for
the system's tools on PATH (mdadm, mount, mountpoint, docker, aws, nvidia-smi, shutdown...)
that record how they were called. Three hosts: a Deep Learning AMI whose dlami-nvme.service
has already mounted the instance store at /opt/dlami/nvme (there `mdadm --create` would fail
"Device or resource busy"), one with raw instance-store drives, and one whose mdadm fails.
"""

from __future__ import annotations

import datetime
import re
import shlex
import stat
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from infra.jobs.spool import (
    CANCEL_NAME,
    DEFAULT_JOB,
    POLL_S,
    SPEC_NAME,
    STATE_NAME,
    JobSpec,
    job_key,
)
from infra.node import boot as userdata
from infra.node.boot import NodeBoot, render_files
from training.checkpoint.s3 import S3Mirror
from training.contract import CRASH_RESTARTS
from training.spec.config import load_config

AWS_ON_MOTO = Path(__file__).with_name("aws_on_moto.py")
HF_TOKEN_SECRET = "gpu-stack/gpu-training-stack-p4d/hf-token"
IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/stack-images:0.1.0-torch2.13.0-cu130-py3.12"

# One script for every tool: it records its name and arguments and behaves as the host says.
FAKE_TOOL = r"""#!/bin/bash
tool=$(basename "$0")
echo "$tool $*" >> "$CALLS"
case "$tool" in
  nvidia-smi) for _ in 1 2 3 4 5 6 7 8; do echo 595.91.07; done ;;
  aws)
    # The S3 calls the job watcher makes, served from the folder $S3_ROOT (bucket/key).
    args=()
    while [ $# -gt 0 ]; do
      if [ "$1" = --region ]; then shift 2; else args+=("$1"); shift; fi
    done
    set -- "${args[@]}"
    if [ "$1 $2" = "ecr get-login-password" ]; then echo token; fi
    if [ "$1 $2" = "secretsmanager get-secret-value" ]; then
      # The stack's secrets, served from the folder $SECRETS (one file per secret name).
      if [ ! -f "$SECRETS/$4" ]; then
        echo "An error occurred (ResourceNotFoundException) when calling the GetSecretValue" \
          "operation: Secrets Manager can't find the specified secret." >&2
        exit 254
      fi
      cat "$SECRETS/$4"
    fi
    if [ "$1 $2" = "s3 ls" ]; then
      # As the real CLI: whole seconds, and exit 1 with no output when nothing matches.
      prefix=${3#s3://}
      listing=""
      if [ -d "$S3_ROOT/$prefix" ]; then
        listing=$(find "$S3_ROOT/$prefix" -type f -printf "%TY-%Tm-%Td %TT %s ${prefix#*/}%P\n" |
          sed -E 's/^([^ ]+ [0-9:]+)\.[0-9]+ /\1 /')
      fi
      [ -n "$listing" ] || exit 1
      echo "$listing"
    fi
    if [ "$1 $2" = "s3 cp" ]; then
      [ "$3" = --only-show-errors ] && shift
      if [ "$3" = - ]; then
        mkdir -p "$(dirname "$S3_ROOT/${4#s3://}")" && cat > "$S3_ROOT/${4#s3://}"
      elif [ "$4" = - ]; then cat "$S3_ROOT/${3#s3://}"; fi
    fi
    ;;
  docker)
    if [ "$1" = login ]; then cat > /dev/null; fi
    if [ "$1" = stop ]; then kill -TERM "$(cat "$CONTAINER_PID")"; fi
    if [ "$1" = run ] && [ "$3" = gpu-training ]; then
      # A job: it trains for the seconds its config names, or a second once it has a
      # checkpoint; SIGTERM checkpoints it and ends it with 75, as the trainer does. Then it
      # says the line its config names, if any, and exits with its config's code (0).
      for arg in "$@"; do
        [ "${previous:-}" = --env-file ] && job_env=$arg
        previous=$arg
      done
      set -a; . "$job_env"; set +a
      # What the container would see of HF_TOKEN: passed by name only (`--env HF_TOKEN`).
      case " $* " in *" --env HF_TOKEN "*) echo "${HF_TOKEN:-}" > "$CONTAINER_PID.hf-token" ;; esac
      echo "$$" > "$CONTAINER_PID"
      echo "container start $(basename "$(dirname "$job_env")")" >> "$CALLS"
      if [ -n "${JOB_PYTHON:-}" ]; then
        # The image's interpreter played by the tests': the job itself, from `python` on.
        while [ "$1" != python ]; do shift; done
        shift
        exec "$JOB_PYTHON" "$@"
      fi
      seconds=$(sed -n 's/^# seconds = //p' "$TRAIN_CONFIG")
      [ -f "$TRAIN_CHECKPOINT_DIR/checkpoint" ] && seconds=1
      checkpoint() { mkdir -p "$TRAIN_CHECKPOINT_DIR" && touch "$TRAIN_CHECKPOINT_DIR/checkpoint"; }
      trap 'checkpoint; exit 75' TERM
      for _ in $(seq "$((seconds * 10))"); do sleep 0.1; done
      says=$(sed -n 's/^# says = //p' "$TRAIN_CONFIG")
      [ -z "$says" ] || echo "$says" >&2
      exit "$(sed -n 's/^# exit = //p' "$TRAIN_CONFIG" | grep . || echo 0)"
    fi
    if [ "$1 $2 $3" = "run --rm --entrypoint" ]; then echo 1000:1000; fi
    if [ "${*: -3}" = "-m training health" ]; then
      echo "health: gpus: ${GATE_GPUS:-ok: 8 x NVIDIA A100-SXM4-40GB} (threshold: 8 x A100)"
      if [ -n "$GATE_GPUS" ]; then
        echo "unhealthy: gpus: $GATE_GPUS (threshold: 8 x A100)"
        exit 69
      fi
    fi
    ;;
  install) for arg in "$@"; do case "$arg" in /*) mkdir -p "$arg" ;; esac; done ;;
  mountpoint) case ":$MOUNTED:" in *":$2:"*) exit 0 ;; *) exit 1 ;; esac ;;
  mdadm)
    if [ -n "$MDADM_BUSY" ] && [ "$1" = --create ]; then
      echo "mdadm: cannot open ${*: -1}: Device or resource busy" >&2
      exit 1
    fi
    [ "$1" != --assemble ]
    ;;
  blkid) exit 2 ;;
  df) printf 'Size\n 7.0T\n' ;;
esac
"""
TOOLS = (
    "nvidia-smi", "aws", "docker", "install", "shutdown", "mdadm", "blkid", "mkfs.ext4",
    "mount", "mountpoint", "df", "gpu-metrics.sh",
)  # fmt: skip


@dataclass
class Host:
    root: Path
    calls: Path
    env: dict[str, str]

    def path(self, node_path: str) -> Path:
        return self.root / node_path.lstrip("/")

    def called(self) -> list[str]:
        return self.calls.read_text().splitlines() if self.calls.exists() else []

    def spool(self, name: str, leaf: str) -> Path:
        """An object of the job spool in the stack's bucket (s3://stack-checkpoints/jobs)."""
        return Path(self.env["S3_ROOT"]) / "stack-checkpoints" / job_key(name, leaf)

    def submit(self, name: str, seconds: int, exit_code: int = 0, says: str = "") -> None:
        """Put a job in the spool as `python -m infra run` does: a job that trains `seconds`,
        then says `says` (its last line) and exits with `exit_code`."""
        config = f"# seconds = {seconds}\n# exit = {exit_code}\n"
        config += f"# says = {says}\n" if says else ""
        spec = JobSpec(
            name=name,
            config_toml=config + "[train]\nsteps = 100\n",
            usd_per_hour=32.77,
            submitted_at=datetime.datetime.now(datetime.UTC),
        )
        self.put(job_key(name, SPEC_NAME), spec.model_dump_json().encode())

    def put(self, key: str, body: bytes) -> None:
        """Any object in the stack's bucket, as a person or a script might leave it."""
        path = Path(self.env["S3_ROOT"]) / "stack-checkpoints" / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(body)

    def state(self, name: str) -> str | None:
        """The node's word on the job: the first line of its state object."""
        path = self.spool(name, STATE_NAME)
        return path.read_text(errors="replace").split("\n")[0].strip() if path.exists() else None

    def reason(self, name: str) -> str:
        """The rest of the state object: why the job failed."""
        return self.spool(name, STATE_NAME).read_text().split("\n", 1)[1].strip()


def simulated_host(
    tmp_path: Path,
    boot: NodeBoot,
    *,
    drives: int = 0,
    default_job: bool = True,
    idle_s: float = 1,
    poll_s: float = 0.2,
    on_moto: bool = False,
    **env: str,
) -> Host:
    """Write the node's files under tmp_path/root, with the node's paths moved there; its
    watcher polls every `poll_s` and stops the node after `idle_s` without a job. `on_moto`:
    the aws CLI reaches moto's server (tests/infra/node/aws_on_moto.py), not a folder."""
    root, bin_dir = tmp_path / "root", tmp_path / "bin"
    moved = (
        userdata.BIN_DIR,
        userdata.ETC_DIR,
        userdata.STATE_DIR,
        userdata.SCRATCH_DIR,
        userdata.DLAMI_NVME_DIR,
    )
    for node_path, content in render_files(boot).items():
        for directory in moved:  # a node path, not the tail of another (/dev/md/scratch)
            content = re.sub(rf"(?<![\w/]){re.escape(directory)}", f"{root}{directory}", content)
        content = content.replace("SYS_BLOCK=/sys/block", f"SYS_BLOCK={root}/sys/block")
        content = content.replace("PULL_RETRY_SECONDS=60", "PULL_RETRY_SECONDS=0")
        content = content.replace(f'float("{POLL_S}")', f'float("{poll_s}")')
        content = content.replace(f'float("{userdata.IDLE_STOP_S}")', f'float("{idle_s}")')
        target = root / node_path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content)
        target.chmod(stat.S_IRWXU)
    models = {"nvme0n1": "Amazon Elastic Block Store"}  # the root volume
    models |= {f"nvme{i}n1": "Amazon EC2 NVMe Instance Storage" for i in range(1, drives + 1)}
    for device, model in models.items():
        (root / "sys/block" / device / "device").mkdir(parents=True)
        (root / "sys/block" / device / "device/model").write_text(model + "\n")
    bin_dir.mkdir()
    for tool in TOOLS:
        (bin_dir / tool).write_text(FAKE_TOOL)
        (bin_dir / tool).chmod(stat.S_IRWXU)
    if on_moto:  # the aws CLI's answers from moto's server (AWS_ENDPOINT_URL) instead
        (bin_dir / "aws").write_text(
            f'#!/bin/bash\necho "aws $*" >> "$CALLS"\nexec {sys.executable} {AWS_ON_MOTO} "$@"\n'
        )
    # The metrics script is the node's own: the stand-in replaces it in the node's bin dir.
    (root / userdata.GPU_METRICS_SCRIPT.lstrip("/")).write_text(FAKE_TOOL)
    calls = tmp_path / "calls"
    (tmp_path / "s3").mkdir()
    host = Host(
        root,
        calls,
        {
            "PATH": f"{bin_dir}:/usr/bin:/bin",
            "CALLS": str(calls),
            "S3_ROOT": str(tmp_path / "s3"),
            "CONTAINER_PID": str(tmp_path / "container.pid"),
            "SECRETS": str(tmp_path / "secrets"),
            **env,
        },
    )
    if default_job:
        host.submit(DEFAULT_JOB, seconds=0)  # the stack's gpu:trainConfig, as `up` writes it
    return host


def start_unit(host: Host, timeout: float = 60) -> subprocess.CompletedProcess:
    """Start gpu-training.service as systemd would: each ExecStartPre (a "-" prefix ignores its
    failure), then ExecStart if they passed."""
    unit = host.path(f"/etc/systemd/system/{userdata.UNIT_NAME}").read_text().splitlines()
    steps = [
        line.split("=", 1) for line in unit if line.startswith(("ExecStartPre=", "ExecStart="))
    ]
    assert [key for key, _ in steps][-1] == "ExecStart"
    for key, command in steps:
        tolerant = command.startswith("-")
        argv = shlex.split(command.removeprefix("-"))
        result = subprocess.run(argv, env=host.env, capture_output=True, text=True, timeout=timeout)
        if result.returncode != 0 and not (key == "ExecStartPre" and tolerant):
            return result
    return result


def p4d_node() -> NodeBoot:
    return NodeBoot(
        image_uri=IMAGE,
        region="us-east-1",
        log_group="/gpu-training/stack",
        min_driver="580.65.06",
        checkpoint_s3_uri="s3://stack-checkpoints/checkpoints",
        instance_store_drives=8,
        hf_token_secret=HF_TOKEN_SECRET,  # none stored, unless a test stores one
    )


def test_on_a_dlami_with_its_nvme_mount_the_job_uses_it_and_reaches_docker_run(tmp_path):
    host = simulated_host(tmp_path, p4d_node(), drives=8)
    dlami = host.path(userdata.DLAMI_NVME_DIR)
    dlami.mkdir(parents=True)
    host.env["MOUNTED"] = str(dlami)
    result = start_unit(host)
    assert result.returncode == 0, result.stdout + result.stderr
    calls = host.called()
    assert f"mount --bind {dlami} {host.path(userdata.SCRATCH_DIR)}" in calls
    assert not any(line.startswith(("mdadm", "mkfs")) for line in calls)
    assert any(line.startswith("docker run --name gpu-training") for line in calls)
    # No HF_TOKEN stored for the stack: the job runs without one, and nothing is said.
    assert not any(" --env HF_TOKEN " in line for line in calls)
    assert f"could not read {HF_TOKEN_SECRET}" not in result.stdout + result.stderr


def test_with_raw_drives_scratch_is_assembled_before_the_job(tmp_path):
    host = simulated_host(tmp_path, p4d_node(), drives=8)
    result = start_unit(host)
    assert result.returncode == 0, result.stdout + result.stderr
    calls = host.called()
    drives = " ".join(f"/dev/nvme{i}n1" for i in range(1, 9))
    create = f"mdadm --create /dev/md/scratch --run --force --level=0 --raid-devices=8 {drives}"
    mount = f"mount -o noatime /dev/md/scratch {host.path(userdata.SCRATCH_DIR)}"
    job = next(i for i, line in enumerate(calls) if line.startswith("docker run --name"))
    assert calls.index(create) < calls.index(mount) < job


def test_a_failing_mdadm_still_trains_on_the_root_volume(tmp_path):
    host = simulated_host(tmp_path, p4d_node(), drives=8, MDADM_BUSY="1")
    result = start_unit(host)
    assert result.returncode == 0, result.stdout + result.stderr
    calls = host.called()
    assert any(line.startswith("mdadm --create") for line in calls)
    assert not any(line.startswith(("mkfs", "mount -o")) for line in calls)
    assert any(line.startswith("docker run --name gpu-training") for line in calls)
    # No HF_TOKEN stored for the stack: the job runs without one, and nothing is said.
    assert not any(" --env HF_TOKEN " in line for line in calls)
    assert f"could not read {HF_TOKEN_SECRET}" not in result.stdout + result.stderr


def test_the_unit_waits_for_the_amis_nvme_setup_and_the_fabric_manager():
    unit = render_files(p4d_node())[f"/etc/systemd/system/{userdata.UNIT_NAME}"]
    (after,) = [line for line in unit.splitlines() if line.startswith("After=")]
    assert {"dlami-nvme.service", "nvidia-fabricmanager.service", "docker.service"} <= set(
        after.removeprefix("After=").split()
    )
    # Ordering only: a Wants= or Requires= on them would fail where the AMI has neither.
    assert "dlami-nvme" not in "".join(
        line for line in unit.splitlines() if line.startswith(("Wants=", "Requires="))
    )


TOPIC = "arn:aws:sns:us-east-1:123456789012:stack-alerts"


def test_the_health_gate_runs_in_the_image_before_the_job(tmp_path):
    boot = NodeBoot(**{**p4d_node().__dict__, "alert_topic_arn": TOPIC})
    host = simulated_host(tmp_path, boot, drives=8)
    result = start_unit(host)
    assert result.returncode == 0, result.stdout + result.stderr
    calls = host.called()
    env_file = host.path(userdata.ENV_FILE)
    gate = calls.index(
        f"docker run --rm --gpus all --ipc=host --env-file {env_file} {IMAGE} "
        "python -m training health"
    )
    job = next(i for i, line in enumerate(calls) if line.startswith("docker run --name"))
    assert gate < job
    assert not any(line.startswith(("aws sns", "shutdown -h now")) for line in calls)


def test_a_node_failing_the_gate_alerts_and_stops_without_training(tmp_path):
    boot = NodeBoot(**{**p4d_node().__dict__, "alert_topic_arn": TOPIC})
    failed = "failed: 7 x NVIDIA A100-SXM4-40GB"
    host = simulated_host(tmp_path, boot, drives=8, GATE_GPUS=failed)
    result = start_unit(host)
    assert result.returncode == 69, result.stdout + result.stderr
    calls = host.called()
    reason = f"gpus: {failed} (threshold: 8 x A100)"
    (publish,) = [line for line in calls if line.startswith("aws sns publish")]
    assert publish.startswith(f"aws sns publish --region us-east-1 --topic-arn {TOPIC} --subject ")
    assert publish.endswith(f"failed its health gate and stops --message {reason}")
    assert calls[-1] == "shutdown -h now gpu-stack: node unhealthy"
    assert not any(line.startswith("docker run --name") for line in calls)
    assert f"gpu-stack: health gate failed: {reason}; stopping this node" in result.stdout
    # systemd does not start it again (the node is stopping anyway).
    unit = host.path(f"/etc/systemd/system/{userdata.UNIT_NAME}").read_text()
    assert "RestartPreventExitStatus=2 69" in unit


# --- the job watcher: jobs sent to a running node ---------------------------------------


def start_unit_in_background(host: Host) -> subprocess.Popen:
    """The unit as systemd starts it, its ExecStart left running."""
    unit = host.path(f"/etc/systemd/system/{userdata.UNIT_NAME}").read_text().splitlines()
    steps = [
        line.split("=", 1) for line in unit if line.startswith(("ExecStartPre=", "ExecStart="))
    ]
    for _, command in steps[:-1]:
        subprocess.run(shlex.split(command.removeprefix("-")), env=host.env, timeout=60)
    return subprocess.Popen(
        shlex.split(steps[-1][1]),
        env=host.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def wait_for(condition, timeout_s: float) -> float:
    """Seconds until `condition()` held; fails after `timeout_s`."""
    started = time.monotonic()
    while not condition():
        assert time.monotonic() - started < timeout_s, f"not within {timeout_s} s"
        time.sleep(0.1)
    return time.monotonic() - started


def containers(host: Host) -> list[str]:
    return [line.split()[-1] for line in host.called() if line.startswith("container start")]


def test_a_job_sent_while_another_runs_takes_the_node_within_30_s_and_both_finish(tmp_path, ci_log):
    host = simulated_host(tmp_path, p4d_node(), drives=8, default_job=False)
    host.submit("first", seconds=120)
    unit = start_unit_in_background(host)
    try:
        wait_for(lambda: containers(host) == ["first"], timeout_s=30)
        assert host.state("first") == "running"
        host.submit("second", seconds=1)
        took = wait_for(lambda: "second" in containers(host), timeout_s=30)
        assert took < 30
        # The first checkpointed (SIGTERM, exit 75) and yielded before the second started.
        assert host.state("first") == "yielded"
        checkpoint = host.path(f"{userdata.STATE_DIR}/checkpoints/first/checkpoint")
        assert checkpoint.exists()
        output, _ = unit.communicate(timeout=60)
    finally:
        unit.kill()
    assert unit.returncode == 0, output
    # Then the first resumed from its checkpoint (a 1 s run) and both finished.
    assert containers(host) == ["first", "second", "first"]
    assert (host.state("first"), host.state("second")) == ("done", "done")
    assert "gpu-stack: job first: checkpoint and stop (yielded)" in output
    # The same host all along: one boot (one health gate), no reboot; it stops once idle.
    calls = host.called()
    assert sum(line.endswith("python -m training health") for line in calls) == 1
    assert [line for line in calls if line.startswith("shutdown")] == [
        "shutdown -h +1 gpu-stack: no job"
    ]
    ci_log(
        f"job spool test: job 'second' sent while 'first' ran was started {took:.1f} s later "
        "on the same host (one boot, one health gate, no new instance); 'first' checkpointed, "
        "yielded (exit 75), resumed and finished"
    )


def test_cancel_stops_a_running_job_with_a_checkpoint_and_skips_a_queued_one(tmp_path):
    host = simulated_host(tmp_path, p4d_node(), drives=8, default_job=False)
    host.submit("long", seconds=120)
    unit = start_unit_in_background(host)
    try:
        wait_for(lambda: containers(host) == ["long"], timeout_s=30)
        host.spool("long", CANCEL_NAME).write_text("")
        wait_for(lambda: host.state("long") == "cancelled", timeout_s=30)
        output, _ = unit.communicate(timeout=60)
    finally:
        unit.kill()
    assert unit.returncode == 0, output
    assert host.path(f"{userdata.STATE_DIR}/checkpoints/long/checkpoint").exists()
    assert containers(host) == ["long"]  # never started again


def test_each_job_gets_its_own_config_checkpoints_prefix_and_price(tmp_path):
    secret, token = HF_TOKEN_SECRET, "hf_sImUlAtEdToKeN"
    boot = NodeBoot(**{**p4d_node().__dict__, "data_s3_uri": "s3://corpus/tokens"})
    host = simulated_host(tmp_path, boot, default_job=False)
    host.submit("lr-sweep", seconds=0)
    (tmp_path / "secrets" / secret).parent.mkdir(parents=True)
    (tmp_path / "secrets" / secret).write_text(token + "\n")  # as `aws ... --output text`
    result = start_unit(host)
    assert result.returncode == 0, result.stdout + result.stderr
    # The stack's HF_TOKEN reaches the container, and no log line, command line, file on the
    # node or object in S3.
    assert (tmp_path / "container.pid.hf-token").read_text() == token + "\n"
    written = [
        path.read_bytes()
        for folder in (host.root, tmp_path / "s3")
        for path in folder.rglob("*")
        if path.is_file()
    ]
    assert not any(token.encode() in content for content in written)
    assert token not in result.stdout + result.stderr + host.calls.read_text()
    # The node's cache is on the scratch disk, owned by the container's user.
    cache = host.path(userdata.CACHE_DIR)
    assert cache.is_dir() and any(str(cache) in line for line in host.called() if "install" in line)
    job_env = host.path(f"{userdata.JOBS_DIR}/lr-sweep/job.env").read_text().splitlines()
    env = dict(line.split("=", 1) for line in host.path(userdata.ENV_FILE).read_text().splitlines())
    env |= dict(line.split("=", 1) for line in job_env)
    config = load_config(env["TRAIN_CONFIG"], env=env)
    assert config.train.steps == 100
    assert config.checkpoint_dir == host.path(f"{userdata.STATE_DIR}/checkpoints/lr-sweep")
    assert Path(config.output_dir) == host.path(f"{userdata.STATE_DIR}/output/lr-sweep")
    assert config.data.path == str(host.path(userdata.DATA_DIR))
    assert env["TRAIN_CACHE_DIR"] == str(cache) and env["HF_HOME"] == f"{cache}/huggingface"
    assert (
        S3Mirror.from_uri(env["TRAIN_S3_URI"]).uri == "s3://stack-checkpoints/checkpoints/lr-sweep"
    )
    assert env["TRAIN_USD_PER_HOUR"] == "32.7700"
    # Its output is a CloudWatch Logs stream of its own (`logs --job lr-sweep`).
    (job_run,) = [line for line in host.called() if "lr-sweep/job.env" in line]
    assert "awslogs-stream=job-lr-sweep" in job_run.split()
    assert "awslogs-stream=node-0" not in job_run.split()


def test_the_watcher_rides_out_an_s3_outage_and_then_runs_the_job(tmp_path):
    # An outage shorter than the idle stop (a node that cannot read its spool for that long
    # stops, as an idle one does).
    host = simulated_host(tmp_path, p4d_node(), drives=8, default_job=False, idle_s=4)
    aws = Path(host.env["PATH"].split(":")[0]) / "aws"
    real = aws.read_text()
    # For its first three calls to S3, the aws CLI fails as it does without a network.
    aws.write_text(
        real.replace(
            'tool=$(basename "$0")\n',
            'tool=$(basename "$0")\n'
            'if [ "$1" = s3 ] && [ "$(grep -c "^aws s3" "$CALLS")" -lt 3 ]; then\n'
            '  echo "aws s3 $*" >> "$CALLS"\n'
            '  echo "Could not connect to the endpoint URL" >&2; exit 255\n'
            "fi\n",
        )
    )
    host.submit("after-outage", seconds=0)
    result = start_unit(host)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("could not read the job spool: Could not connect") == 3
    assert containers(host) == ["after-outage"] and host.state("after-outage") == "done"


# --- a job spool no job, no object and no node can break --------------------------------


def shutdowns(host: Host) -> list[str]:
    return [line for line in host.called() if line.startswith("shutdown")]


def test_an_empty_spool_stops_the_node_once_idle(tmp_path):
    """`aws s3 ls` exits 1 on a prefix with nothing under it: that is an empty spool, not an
    unreadable one, and a node with no job stops itself (no GPU billing forever)."""
    host = simulated_host(tmp_path, p4d_node(), drives=8, default_job=False)
    result = start_unit(host, timeout=30)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "could not read the job spool" not in result.stdout
    assert shutdowns(host) == ["shutdown -h +1 gpu-stack: no job"]


STEP_5 = "failed: rank 0 (local rank 0) on node 0 (ip-10-0-1-7) exited with status 1: " + (
    "RuntimeError: loss is NaN at step 5"
)
IMPORT = "error: model.builder = 'lab.broken:build': cannot import lab.broken, importing " + (
    "it raised SyntaxError: invalid syntax (broken.py, line 1); fix the module"
)
HANG = "failed: hang: no rank finished a step (or a part of a checkpoint save) for 601.0 s"


@pytest.mark.parametrize(
    ("exit_code", "says", "starts", "reason"),
    [
        (1, STEP_5, CRASH_RESTARTS + 1, STEP_5.removeprefix("failed: ")),
        (2, IMPORT, 1, IMPORT.removeprefix("error: ")),
        (75, HANG, CRASH_RESTARTS + 1, HANG.removeprefix("failed: ")),
        (137, "", CRASH_RESTARTS + 1, "exit 137"),  # killed (out of memory): nothing said
    ],
    ids=["raises at step 5", "syntax error on import", "hangs", "killed"],
)
def test_a_failing_job_is_marked_failed_with_its_reason_and_the_next_job_runs(
    tmp_path, exit_code, says, starts, reason
):
    """A crash is started again (within the bound every restart of a job has), bad
    configuration never; then the job is failed, with the line that says why, and the
    job behind it runs. The watcher itself never exits for a job's fault."""
    host = simulated_host(tmp_path, p4d_node(), drives=8, default_job=False)
    host.submit("behind", seconds=0)
    host.submit("broken", seconds=0, exit_code=exit_code, says=says)  # newest: first
    result = start_unit(host)
    assert result.returncode == 0, result.stdout + result.stderr
    assert containers(host) == ["broken"] * starts + ["behind"]
    assert (host.state("broken"), host.state("behind")) == ("failed", "done")
    assert host.reason("broken").startswith(reason)
    assert shutdowns(host) == ["shutdown -h +1 gpu-stack: no job"]


def test_malformed_spool_objects_are_skipped_and_the_good_job_runs(tmp_path):
    host = simulated_host(tmp_path, p4d_node(), drives=8, default_job=False)
    host.put(job_key("not-json", SPEC_NAME), b"{this is not json")
    host.put(job_key("no-keys", SPEC_NAME), b'{"name": "no-keys"}')
    host.put(job_key("binary", SPEC_NAME), bytes(range(256)))
    host.put("jobs/README", b"a stray object beside the jobs")
    host.put("jobs/some job/job.json", b"{}")  # not a job name
    host.put("jobs/deep/er/job.json", b"{}")
    host.submit("paused", seconds=0)
    host.put(job_key("paused", STATE_NAME), b"paused\n")  # a state no node writes
    host.submit("garbled", seconds=0)
    host.put(job_key("garbled", STATE_NAME), b"\xff\xfe\x00running")
    host.submit("good", seconds=0)
    result = start_unit(host)
    assert result.returncode == 0, result.stdout + result.stderr
    assert containers(host) == ["good"]
    assert host.state("good") == "done"
    for name in ("not-json", "no-keys", "binary"):
        assert host.state(name) == "failed", name
        assert host.reason(name).startswith(f"{SPEC_NAME} is not a job:"), host.reason(name)
    assert host.state("paused") == "paused"  # left as it is, never run
    assert shutdowns(host) == ["shutdown -h +1 gpu-stack: no job"]


def test_jobs_submitted_together_run_newest_first_and_the_older_waits_its_turn(tmp_path):
    """The newest job takes the GPUs; an older one queued behind it never stops it."""
    host = simulated_host(tmp_path, p4d_node(), drives=8, default_job=False)
    host.submit("alpha", seconds=1)
    host.submit("beta", seconds=1)  # within the same second of S3's clock, most likely
    result = start_unit(host)
    assert result.returncode == 0, result.stdout + result.stderr
    assert containers(host) == ["beta", "alpha"]
    assert (host.state("alpha"), host.state("beta")) == ("done", "done")


def test_an_older_job_sent_again_is_the_newest_and_takes_the_gpus(tmp_path):
    """Sent again, a job is as new as its new job.json: it preempts the running one."""
    host = simulated_host(tmp_path, p4d_node(), drives=8, default_job=False)
    host.submit("first", seconds=120)
    unit = start_unit_in_background(host)
    try:
        wait_for(lambda: containers(host) == ["first"], timeout_s=30)
        time.sleep(1.1)  # the next second on S3's clock
        host.submit("second", seconds=120)
        wait_for(lambda: containers(host) == ["first", "second"], timeout_s=30)
        time.sleep(1.1)
        host.submit("first", seconds=0)  # `run --name first` again
        wait_for(lambda: containers(host) == ["first", "second", "first"], timeout_s=30)
        assert host.state("second") == "yielded"
    finally:
        unit.kill()


def test_a_command_job_runs_its_command_through_training_exec(tmp_path):
    host = simulated_host(tmp_path, p4d_node(), default_job=False)
    spec = JobSpec(
        name="sweep",
        config_toml="",
        usd_per_hour=32.77,
        submitted_at=datetime.datetime.now(datetime.UTC),
        command=("torchrun", "--nproc-per-node", "8", "train.py", "--lr", "3e-4"),
    )
    host.put(job_key("sweep", SPEC_NAME), spec.model_dump_json().encode())
    result = start_unit(host)
    assert result.returncode == 0, result.stdout + result.stderr
    (job_run,) = [line for line in host.called() if "sweep/job.env" in line]
    image_and_command = job_run.split(" python ", 1)[1]
    assert image_and_command == "-m training exec -- torchrun --nproc-per-node 8 train.py --lr 3e-4"
    assert host.state("sweep") == "done"
