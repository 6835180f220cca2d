"""Each node's user data: a `#cloud-config` document that prepares the node and starts its
job watcher.

cloud-init writes the boot scripts (infra/node/templates/*.sh, linted by shellcheck), the
job watcher (watch-jobs.py), the node's environment file and a systemd unit, then enables
the unit. The unit, not cloud-init, starts the watcher, so it starts again on every boot:
after a spot interruption the persistent request restarts the stopped node and the job
resumes from its last checkpoint without anyone logging in.

The user data says only how to find the jobs: the job spool in the stack's bucket
(infra/jobs/spool.py). What to train and the price travel there, so a new job, a new
price or a changed gpu:trainConfig leaves the user data, and the instance, as they are.

Pure Python: the Pulumi program calls `render_user_data` inside an apply once the
image URI and bucket are known; the tests call it directly.
"""

from __future__ import annotations

import base64
import gzip
import re
import string
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from infra.jobs import spool
from infra.jobs.spool import JobState
from infra.node.agent import cloudwatch_agent_config
from training.contract import (
    CODE_URI_ENV,
    CRASH_RESTARTS,
    CRASH_WINDOW_S,
    ERROR_PREFIX,
    FAILURE_PREFIX,
    HF_HOME_ENV,
    HF_TOKEN_ENV,
    UNHEALTHY_PREFIX,
    ExitCode,
)
from training.health.expectation import NodeExpectation

TEMPLATES = Path(__file__).parent / "templates"

# Where things live on a node. The container sees the same paths (bind mounts).
BIN_DIR = "/opt/gpu-stack"
ETC_DIR = "/etc/gpu-stack"
STATE_DIR = "/var/lib/gpu-stack"  # root EBS volume: survives stop/start
SCRATCH_DIR = "/scratch"  # instance-store RAID0 where the type has it: wiped on stop
ENV_FILE = f"{ETC_DIR}/training.env"
AGENT_CONFIG_FILE = f"{ETC_DIR}/cloudwatch-agent.json"
DATA_DIR = f"{SCRATCH_DIR}/data"
# Tokenized data, models copied from S3 (TRAIN_CACHE_DIR) and from the Hub (HF_HOME): on the
# instance store, fetched again after a stop wipes it (the S3 copy of the tokens stays).
CACHE_DIR = f"{SCRATCH_DIR}/cache"
JOBS_DIR = f"{STATE_DIR}/jobs"  # each job's config and env file, as the watcher wrote them
GPU_METRICS_SCRIPT = f"{BIN_DIR}/gpu-metrics.sh"
JOB_WATCHER = f"{BIN_DIR}/watch-jobs.py"
# With no job to run for this long, the watcher stops the node (`start`, then `run`).
IDLE_STOP_S = 15 * 60
# Where the Deep Learning AMIs' dlami-nvme.service mounts the instance store (LVM over the
# NVMe drives) before user data runs: DLAMI release notes, "nvme_location /opt/dlami/nvme"
# (Base OSS Nvidia Driver GPU AMI, Ubuntu 22.04,
# https://docs.aws.amazon.com/dlami/latest/devguide/appendix-ami-release-notes.html).
DLAMI_NVME_DIR = "/opt/dlami/nvme"
UNIT_NAME = "gpu-training.service"

# EC2 rejects user data over 16 KB (RunInstances).
MAX_USER_DATA_BYTES = 16 * 1024

# Values end up inside double-quoted shell strings and an env file: refuse
# anything that could break out of them (all values come from checked config).
_SAFE_VALUE = re.compile(r'^[^"$`\\\n\r]*$')


class ScriptTemplate(string.Template):
    """`@@name@@` placeholders: a template with them quoted is still valid shell."""

    delimiter = "@@"
    pattern = r"@@(?:(?P<escaped>(?!))|(?P<named>[a-z0-9_]+)@@|(?P<braced>(?!))|(?P<invalid>))"


@dataclass(frozen=True)
class NodeBoot:
    """Everything one node's boot needs to know."""

    image_uri: str
    region: str
    log_group: str
    min_driver: str
    checkpoint_s3_uri: str
    instance_store_drives: int
    data_s3_uri: str | None = None
    alert_topic_arn: str = ""  # where a failed health gate is reported; "": nowhere
    hf_token_secret: str = ""  # the stack's HF_TOKEN secret (infra/jobs/hf_token.py); "": none
    # The catalog's figures for the node's type, for the health gate.
    expectation: NodeExpectation = field(default_factory=NodeExpectation)

    @property
    def registry(self) -> str:
        return self.image_uri.split("/", 1)[0]

    @property
    def spool_uri(self) -> str:
        """The job spool: under the checkpoint bucket, which the node's role reads and writes."""
        bucket = self.checkpoint_s3_uri.removeprefix("s3://").split("/", 1)[0]
        return f"s3://{bucket}/{spool.SPOOL_PREFIX}"

    def environment(self) -> dict[str, str]:
        """The container's environment every job shares (docs/contracts.md section 3); the
        watcher adds each job's own (config, checkpoint folder and prefix, price)."""
        env = {
            "AWS_REGION": self.region,
            "AWS_DEFAULT_REGION": self.region,
            "TRAIN_CACHE_DIR": CACHE_DIR,
            HF_HOME_ENV: f"{CACHE_DIR}/huggingface",
            **self.expectation.to_env(),
        }
        if self.data_s3_uri:
            env["TRAIN_DATA_PATH"] = DATA_DIR
        return env


def job_path_overrides(*, data_from_s3: bool) -> dict[str, str]:
    """The container variables that override the training config's paths on every node.

    The stack's config check loads gpu:trainConfig with them, as the node's trainer will.
    """
    env = {
        "TRAIN_CHECKPOINT_DIR": f"{STATE_DIR}/checkpoints",
        "TRAIN_OUTPUT_DIR": f"{STATE_DIR}/output",
    }
    if data_from_s3:
        env["TRAIN_DATA_PATH"] = DATA_DIR
    return env


def render_template(name: str, values: dict[str, object]) -> str:
    """Fill a template from infra/templates with checked values."""
    for key, value in values.items():
        if not _SAFE_VALUE.match(str(value)):
            raise ValueError(f"boot value {key}={value!r} contains a quote, $, ` or newline")
    text = ScriptTemplate((TEMPLATES / name).read_text()).substitute(
        {key: str(value) for key, value in values.items()}
    )
    return _without_comment_lines(text)


def _without_comment_lines(text: str) -> str:
    """The template without its whole-line comments (the shebang stays) and blank lines: they
    explain the templates in this repository, and EC2 caps user data at 16 KB."""
    lines = text.splitlines(keepends=True)
    return "".join(
        line
        for index, line in enumerate(lines)
        if line.strip()
        and (not line.lstrip().startswith("#") or (index == 0 and line.startswith("#!")))
    )


def render_files(node: NodeBoot) -> dict[str, str]:
    """Path on the node → content, for every file the boot writes."""
    common = {"scratch_dir": SCRATCH_DIR, "state_dir": STATE_DIR}
    job_paths = job_path_overrides(data_from_s3=False)
    files = {
        f"{BIN_DIR}/prepare-scratch.sh": render_template(
            "prepare-scratch.sh",
            {
                "scratch_dir": SCRATCH_DIR,
                "dlami_nvme_dir": DLAMI_NVME_DIR,
                "instance_store_drives": node.instance_store_drives,
            },
        ),
        f"{BIN_DIR}/run-training.sh": render_template(
            "run-training.sh",
            {
                **common,
                "image_uri": node.image_uri,
                "registry": node.registry,
                "region": node.region,
                "min_driver": node.min_driver,
                "log_group": node.log_group,
                "data_s3_uri": node.data_s3_uri or "",
                "data_dir": DATA_DIR,
                "cache_dir": CACHE_DIR,
                "env_file": ENV_FILE,
                "job_watcher": JOB_WATCHER,
                "gpu_metrics": GPU_METRICS_SCRIPT,
                "alert_topic_arn": node.alert_topic_arn,
                "exit_node_unhealthy": int(ExitCode.NODE_UNHEALTHY),
                "unhealthy_prefix": UNHEALTHY_PREFIX,
            },
        ),
        JOB_WATCHER: render_template(
            "watch-jobs.py",
            {
                "spool_uri": node.spool_uri,
                "checkpoint_uri": node.checkpoint_s3_uri.rstrip("/"),
                "region": node.region,
                "jobs_dir": JOBS_DIR,
                "checkpoint_root": job_paths["TRAIN_CHECKPOINT_DIR"],
                "output_root": job_paths["TRAIN_OUTPUT_DIR"],
                "poll_s": spool.POLL_S,
                "idle_stop_s": IDLE_STOP_S,
                "spool_names": " ".join(
                    (spool.SPEC_NAME, spool.CANCEL_NAME, spool.STATE_NAME, spool.CODE_NAME)
                ),
                "job_states": " ".join(
                    state.value
                    for state in (
                        JobState.QUEUED,
                        JobState.RUNNING,
                        JobState.YIELDED,
                        JobState.DONE,
                        JobState.CANCELLED,
                        JobState.FAILED,
                    )
                ),
                "job_name_pattern": spool.JOB_NAME_PATTERN,
                "exit_bad_config": int(ExitCode.BAD_CONFIG),
                "exit_interrupted": int(ExitCode.INTERRUPTED),
                "crash_restarts": CRASH_RESTARTS,
                "crash_window_s": CRASH_WINDOW_S,
                "reason_prefixes": f"{ERROR_PREFIX.strip()} {FAILURE_PREFIX.strip()}",
                "code_uri_env": CODE_URI_ENV,
                "job_log_stream_prefix": spool.JOB_LOG_STREAM_PREFIX,
                "hf_token_secret": node.hf_token_secret,
                "hf_token_env": HF_TOKEN_ENV,
            },
        ),
        f"/etc/systemd/system/{UNIT_NAME}": render_template(
            UNIT_NAME,
            {
                "bin_dir": BIN_DIR,
                "exit_bad_config": str(int(ExitCode.BAD_CONFIG)),
                "start_limit_burst": CRASH_RESTARTS + 1,
                "crash_window_s": CRASH_WINDOW_S,
                "exit_node_unhealthy": str(int(ExitCode.NODE_UNHEALTHY)),
            },
        ),
        ENV_FILE: _env_file(node.environment()),
        GPU_METRICS_SCRIPT: render_template("gpu-metrics.sh", {"agent_config": AGENT_CONFIG_FILE}),
        # The idle alarm reads the metric this agent config publishes.
        AGENT_CONFIG_FILE: cloudwatch_agent_config(),
    }
    return files


def render_user_data(node: NodeBoot) -> str:
    """The node's `#cloud-config` user data."""
    text = _cloud_config(node)
    size = len(text.encode())
    if size > MAX_USER_DATA_BYTES:
        raise ValueError(
            f"the node's user data is {size} bytes, over EC2's "
            f"{MAX_USER_DATA_BYTES}: shorten the boot scripts"
        )
    return text


def _cloud_config(node: NodeBoot) -> str:
    files = render_files(node)
    document = {
        "write_files": [
            {
                "path": path,
                "owner": "root:root",
                "permissions": "0755" if path.endswith((".sh", ".py")) else "0644",
                **_written(path, content),
            }
            for path, content in files.items()
        ],
        "runcmd": [
            ["systemctl", "daemon-reload"],
            # --no-block: runcmd runs inside cloud-init's final stage; the unit
            # waits for docker and the network, and runs on every later boot too.
            ["systemctl", "enable", "--now", "--no-block", UNIT_NAME],
        ],
    }
    return "#cloud-config\n" + yaml.dump(
        document, Dumper=_LiteralDumper, sort_keys=False, width=1000
    )


def _written(path: str, content: str) -> dict[str, str]:
    """The watcher goes compressed (cloud-init's write_files `encoding: gz+b64`,
    https://cloudinit.readthedocs.io/en/latest/reference/modules.html#write-files): it is
    the largest file and EC2 caps user data at 16 KB. No timestamp in the gzip header, so
    the same script is the same bytes, and no new node."""
    if path != JOB_WATCHER:
        return {"content": content}
    packed = gzip.compress(content.encode(), mtime=0)
    return {"encoding": "gz+b64", "content": base64.b64encode(packed).decode()}


def largest_user_data_bytes() -> int:
    """Size of the largest user data any node could get: a node with every option on and
    the longest values the config allows (ECR URI with a 128-character tag, a long S3 data
    URI); a test keeps it under EC2's 16 KB."""
    longest = NodeBoot(
        image_uri=f"123456789012.dkr.ecr.ap-southeast-2.amazonaws.com/{'r' * 64}:{'t' * 128}",
        region="ap-southeast-2",
        log_group=f"/gpu-training/{'s' * 128}",
        min_driver="999.999.99",
        checkpoint_s3_uri=f"s3://{'b' * 63}/checkpoints",
        instance_store_drives=99,
        data_s3_uri=f"s3://{'d' * 63}/{'p' * 200}",
        alert_topic_arn=f"arn:aws:sns:ap-southeast-2:123456789012:{'a' * 256}",
        hf_token_secret=f"gpu-stack/{'s' * 128}/hf-token",
        expectation=NodeExpectation(gpus=8, gpu_model="H200", busbw_gbps=999.5, efa_devices=32),
    )
    return len(_cloud_config(longest).encode())


def _env_file(env: dict[str, str]) -> str:
    """docker --env-file format: KEY=value per line, no quoting."""
    for key, value in env.items():
        if not _SAFE_VALUE.match(value):
            raise ValueError(f"environment value {key}={value!r} contains a quote, $, ` or newline")
    return "".join(f"{key}={value}\n" for key, value in env.items())


class _LiteralDumper(yaml.SafeDumper):
    """Writes multi-line strings as `|` blocks, so the scripts stay readable."""


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_LiteralDumper.add_representer(str, _represent_str)
