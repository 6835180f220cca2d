"""Boot user data: valid cloud-config, shellcheck-clean scripts, and scripts that do their job.

The boot scripts run here for real, with stand-ins for nvidia-smi, aws and docker
on PATH that record how they were called.
"""

from __future__ import annotations

import ast
import re
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
import yaml

from common.versions import version_key
from images.matrix import load_matrix
from infra.knowledge.catalog import load_catalog
from infra.node import boot as userdata
from infra.node.boot import NodeBoot, largest_user_data_bytes, render_files, render_user_data
from tests.support.tools import require_tool
from training import contract
from training.contract import ExitCode
from training.spec.selfcheck import SelfCheckError, check_driver

IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/stack-images:0.1.0-torch2.13.0-cu130-py3.12"


def node(**overrides) -> NodeBoot:
    values = {
        "image_uri": IMAGE,
        "region": "us-east-1",
        "log_group": "/gpu-training/stack",
        "min_driver": "580.65.06",
        "checkpoint_s3_uri": "s3://stack-checkpoints/checkpoints",
        "instance_store_drives": 8,
        "data_s3_uri": "s3://corpus/tokens",
    }
    return NodeBoot(**{**values, **overrides})


SHAPES = {
    "data-config": node(),
    "single-node-plain": node(data_s3_uri=None, instance_store_drives=0),
}


@pytest.mark.parametrize("shape", SHAPES)
def test_user_data_is_valid_cloud_config(shape, tmp_path):
    cloud_init = require_tool("cloud-init", "cloud-init")
    path = tmp_path / "user-data"
    path.write_text(render_user_data(SHAPES[shape]))
    result = subprocess.run(
        [cloud_init, "schema", "--config-file", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Valid cloud-config" in result.stdout


@pytest.mark.parametrize("shape", SHAPES)
def test_rendered_scripts_pass_shellcheck(shape, tmp_path):
    shellcheck = require_tool("shellcheck", "shellcheck")
    scripts = {p: c for p, c in render_files(SHAPES[shape]).items() if p.endswith(".sh")}
    assert len(scripts) == 3
    for path, content in scripts.items():
        script = tmp_path / Path(path).name
        script.write_text(content)
        result = subprocess.run(
            [shellcheck, str(script)], capture_output=True, text=True, timeout=60
        )
        assert result.returncode == 0, f"{path}:\n{result.stdout}"


def test_templates_themselves_pass_shellcheck():
    shellcheck = require_tool("shellcheck", "shellcheck")
    templates = sorted(userdata.TEMPLATES.glob("*.sh"))
    assert templates
    result = subprocess.run(
        [shellcheck, *map(str, templates)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout


def test_cloud_config_writes_the_unit_and_enables_it_for_every_boot():
    document = yaml.safe_load(render_user_data(node()))
    paths = [item["path"] for item in document["write_files"]]
    assert "/etc/systemd/system/gpu-training.service" in paths
    assert "/opt/gpu-stack/watch-jobs.py" in paths
    assert ["systemctl", "enable", "--now", "--no-block", "gpu-training.service"] in document[
        "runcmd"
    ]
    unit = render_files(node())["/etc/systemd/system/gpu-training.service"]
    for line in (
        "Restart=on-failure",
        "RestartPreventExitStatus=2 69",  # bad configuration, node unhealthy
        "WantedBy=multi-user.target",
        "ExecStartPre=-/opt/gpu-stack/prepare-scratch.sh",  # "-": scratch never stops the job
        "ExecStart=/opt/gpu-stack/run-training.sh",
    ):
        assert line in unit.splitlines()


def test_the_unit_follows_the_trainers_exit_codes_and_stops_the_scripts_container():
    files = render_files(node())
    unit = files[f"/etc/systemd/system/{userdata.UNIT_NAME}"].splitlines()
    service = dict(line.split("=", 1) for line in unit if "=" in line and line[0] != "#")
    # on-failure: 1 (failed) and 75 (interrupted, checkpointed) start the job again, 0 does not.
    assert service["Restart"] == "on-failure"
    assert service["RestartPreventExitStatus"].split() == [
        str(int(ExitCode.BAD_CONFIG)),
        str(int(ExitCode.NODE_UNHEALTHY)),
    ]
    # A crash is started again 3 times in 6 hours, as the Slurm batch script does: 4 starts.
    assert (service["StartLimitBurst"], service["StartLimitIntervalSec"]) == ("4", "21600")
    # ExecStop stops the container run-training.sh starts (SIGTERM: the trainer checkpoints),
    # within systemd's own stop timeout, after which it would kill everything at once.
    stop = re.fullmatch(r"/usr/bin/docker stop --time (\d+) (\S+)", service["ExecStop"])
    script = files[f"{userdata.BIN_DIR}/run-training.sh"]
    container = re.search(r"^readonly CONTAINER=(\S+)$", script, flags=re.MULTILINE)
    assert stop is not None and container is not None
    assert stop.group(2) == container.group(1)
    assert int(stop.group(1)) < int(service["TimeoutStopSec"])


def test_no_secret_reaches_user_data():
    text = render_user_data(node())
    for word in ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "--password ", "PRIVATE KEY"):
        assert word not in text
    # The registry login reads a short-lived token from the instance role at boot.
    assert "--password-stdin" in text


@pytest.mark.parametrize("shape", SHAPES)
def test_the_largest_node_bounds_every_real_node_and_fits_ec2(shape):
    real = render_user_data(SHAPES[shape])
    assert len(real.encode()) <= largest_user_data_bytes() <= 16 * 1024


def test_user_data_over_16_kb_is_refused():
    with pytest.raises(ValueError, match="over EC2's 16384"):
        render_user_data(node(log_group="/gpu-training/" + "g" * 9000))


def test_values_that_could_break_out_of_quotes_are_refused():
    with pytest.raises(ValueError, match="image_uri"):
        render_files(node(image_uri='registry/repo:tag"; rm -rf /; "'))


# --- the scripts, run with stand-ins --------------------------------------------------------

# One line per GPU, as on an 8-GPU node.
FAKE_NVIDIA_SMI = """#!/bin/bash
echo "$*" >> "$CALLS/nvidia-smi"
if [ -n "$FAKE_DRIVER" ]; then
  for _ in 1 2 3 4 5 6 7 8; do echo "$FAKE_DRIVER"; done
fi
"""
FAKE_AWS = """#!/bin/bash
echo "$*" >> "$CALLS/aws"
if [ "$1 $2" = "ecr get-login-password" ]; then echo token; fi
if [ "$1 $2" = "s3 sync" ]; then exit "${FAKE_SYNC_EXIT:-0}"; fi
"""
FAKE_DOCKER = """#!/bin/bash
printf '%s\\n' "$@" > "$CALLS/docker-$1"
echo "$1" >> "$CALLS/docker"
if [ "$1" = login ]; then cat > /dev/null; fi
if [ "$1" = pull ] && [ "$(grep -c pull "$CALLS/docker")" -le "$FAKE_PULL_FAILURES" ]; then
  exit 1
fi
if [ "$1 $2 $3" = "run --rm --entrypoint" ]; then  # asking the image for its user
  printf '%s\n' "$@" > "$CALLS/docker-user-query"
  echo "$FAKE_IMAGE_USER"
  exit 0
fi
if [ "$1" = run ]; then exit "$FAKE_EXIT"; fi
"""
# Records the call and makes the directories: chown to the image's user needs root.
FAKE_RECORDER = """#!/bin/bash
echo "$(basename "$0") $*" >> "$CALLS/host"
"""
# The job watcher run-training.sh hands the node to (tested on its own in
# test_simulated_boot.py): here it runs the image once with the options it was given.
FAKE_WATCHER = """import os, subprocess, sys
with open(os.path.join(os.environ["CALLS"], "watcher"), "w") as calls:
    calls.write("\\n".join(sys.argv[1:]))
sys.exit(subprocess.run(["docker", "run", *sys.argv[2:], sys.argv[1]]).returncode)
"""
FAKE_INSTALL = """#!/bin/bash
echo "$*" >> "$CALLS/install"
for arg in "$@"; do case "$arg" in /*) mkdir -p "$arg" ;; esac; done
"""


def run_training_script(
    tmp_path: Path,
    boot: NodeBoot,
    *,
    driver: str,
    exit_code: int = 0,
    pull_failures: int = 0,
    image_user: str = "1000:1000",
    sync_exit: int = 0,
):
    """Render run-training.sh with its state and scratch under tmp_path, run it with stand-ins."""
    root = tmp_path / "node"
    script = render_files(boot)[f"{userdata.BIN_DIR}/run-training.sh"]
    for directory in (
        userdata.STATE_DIR,
        userdata.SCRATCH_DIR,
        userdata.ETC_DIR,
        userdata.BIN_DIR,
    ):
        script = script.replace(directory, f"{root}{directory}")
    script = script.replace("PULL_RETRY_SECONDS=60", "PULL_RETRY_SECONDS=0")
    metrics = root / userdata.GPU_METRICS_SCRIPT.lstrip("/")
    metrics.parent.mkdir(parents=True)
    metrics.write_text(FAKE_RECORDER)
    metrics.chmod(stat.S_IRWXU)
    (root / userdata.JOB_WATCHER.lstrip("/")).write_text(FAKE_WATCHER)
    path = tmp_path / "run-training.sh"
    path.write_text(script)
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls"
    bin_dir.mkdir()
    calls.mkdir()
    stand_ins = {
        "nvidia-smi": FAKE_NVIDIA_SMI,
        "aws": FAKE_AWS,
        "docker": FAKE_DOCKER,
        "install": FAKE_INSTALL,
        "shutdown": FAKE_RECORDER,
    }
    for name, body in stand_ins.items():
        (bin_dir / name).write_text(body)
        (bin_dir / name).chmod(stat.S_IRWXU)
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "CALLS": str(calls),
        "FAKE_DRIVER": driver,
        "FAKE_EXIT": str(exit_code),
        "FAKE_PULL_FAILURES": str(pull_failures),
        "FAKE_IMAGE_USER": image_user,
        "FAKE_SYNC_EXIT": str(sync_exit),
    }
    result = subprocess.run(
        ["bash", str(path)], env=env, capture_output=True, text=True, timeout=60
    )
    return result, calls, root


def docker_run_args(calls: Path) -> list[str]:
    return (calls / "docker-run").read_text().splitlines()


def test_missing_driver_is_a_retryable_failure(tmp_path):
    result, calls, _ = run_training_script(tmp_path, node(), driver="")
    assert result.returncode == 1  # not 2: systemd tries again once the driver is up
    assert not (calls / "docker-run").exists()


def test_old_driver_stops_with_a_message_and_exit_2(tmp_path):
    result, calls, _ = run_training_script(tmp_path, node(), driver="535.104.05")
    assert result.returncode == 2  # systemd: RestartPreventExitStatus=2, no retry loop
    assert "NVIDIA driver 535.104.05 is older than 580.65.06" in result.stdout
    assert IMAGE in result.stdout
    assert not (calls / "docker-run").exists()
    assert not (calls / "docker-pull").exists()


@pytest.mark.parametrize("driver", ["580.65.06", "580.105.08", "595.91.07"])
def test_driver_at_or_above_the_minimum_starts_the_job(tmp_path, driver):
    result, calls, _ = run_training_script(tmp_path, node(), driver=driver)
    assert result.returncode == 0, result.stdout + result.stderr
    assert (calls / "docker-run").exists()


def boot_accepts_driver(tmp_path: Path, min_driver: str, driver: str) -> bool:
    """Whether run-training.sh starts the job with this driver and this minimum."""
    result, _, _ = run_training_script(tmp_path, node(min_driver=min_driver), driver=driver)
    assert result.returncode in (0, 2), result.stdout + result.stderr
    return result.returncode == 0


def image_accepts_driver(min_driver: str, driver: str) -> bool:
    """Whether the image's own start-up check (TRAIN_MIN_DRIVER) lets the job run."""
    try:
        check_driver(min_driver, driver)
    except SelfCheckError:
        return False
    return True


@pytest.mark.parametrize(
    ("min_driver", "driver", "new_enough"),
    [
        ("580.65.06", "595.91.07", True),
        ("595.91.07", "580.65.06", False),
        ("570.26", "570.195.03", True),  # the matrix writes some minimums with two parts
        ("570.26", "570.26.00", True),
        ("570.26.00", "570.26", True),
        ("580.65.6", "580.65.06", True),
        ("570.26.1", "570.26", False),
        ("560.28.03", "560.9.99", False),
    ],
)
def test_boot_image_and_resolver_judge_a_driver_alike(tmp_path, min_driver, driver, new_enough):
    assert boot_accepts_driver(tmp_path, min_driver, driver) is new_enough
    assert image_accepts_driver(min_driver, driver) is new_enough
    assert (version_key(driver) >= version_key(min_driver)) is new_enough


def test_boot_image_and_resolver_agree_on_every_catalog_driver_and_variant(tmp_path):
    pairs = [
        (variant, ami)
        for variant in load_matrix().variants
        if variant.min_driver
        for ami in load_catalog().amis
    ]
    assert pairs
    for index, (variant, ami) in enumerate(pairs):
        (tmp_path / str(index)).mkdir()
        verdicts = {
            "resolver": ami.runs_driver(variant.min_driver),
            "boot": boot_accepts_driver(
                tmp_path / str(index), variant.min_driver, ami.driver_version
            ),
            "image": image_accepts_driver(variant.min_driver, ami.driver_version),
        }
        assert len(set(verdicts.values())) == 1, (variant.name, ami.name, verdicts)


def test_job_gets_gpus_logs_config_and_data(tmp_path):
    result, calls, root = run_training_script(tmp_path, node(), driver="595.91.07")
    assert result.returncode == 0, result.stdout + result.stderr
    args = docker_run_args(calls)
    for flag in (
        "--gpus",
        "--ipc=host",
        "awslogs",
        "awslogs-group=/gpu-training/stack",
        "awslogs-stream=node-0",
        f"{root}/etc/gpu-stack/training.env",
    ):
        assert flag in args, flag
    assert args[-1] == IMAGE
    # One node: the container stays on docker's bridge, with no EFA devices.
    assert "--network" not in args
    assert "--device=/dev/infiniband" not in args
    aws_calls = (calls / "aws").read_text()
    assert f"s3 sync s3://corpus/tokens {root}/scratch/data" in aws_calls
    assert "ecr get-login-password --region us-east-1" in aws_calls
    assert (calls / "docker-login").read_text().splitlines()[-1] == IMAGE.split("/")[0]
    assert (calls / "docker-pull").read_text().splitlines()[-1] == IMAGE


@pytest.mark.parametrize("sync_exit", [1, 2, 255])
def test_a_failed_data_sync_is_retried_whatever_the_aws_cli_exit_code(tmp_path, sync_exit):
    # The aws CLI exits 2 when it skips files: passed on, systemd would take it for the
    # trainer's "bad configuration" and never start the job again.
    result, calls, _ = run_training_script(
        tmp_path, node(), driver="595.91.07", sync_exit=sync_exit
    )
    assert result.returncode == 1
    assert "could not sync s3://corpus/tokens" in result.stdout
    assert not (calls / "docker-run").exists()


def test_a_job_without_data_syncs_nothing(tmp_path):
    result, calls, _ = run_training_script(
        tmp_path, SHAPES["single-node-plain"], driver="595.91.07"
    )
    assert result.returncode == 0, result.stdout + result.stderr
    args = docker_run_args(calls)
    assert "--gpus" in args and "--ipc=host" in args
    assert not (calls / "aws").read_text().count("s3 sync")


def test_an_image_not_pushed_yet_is_waited_for(tmp_path):
    result, calls, _ = run_training_script(tmp_path, node(), driver="595.91.07", pull_failures=3)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count(f"waiting for {IMAGE} to be pushed") == 3
    steps = (calls / "docker").read_text().split()
    assert steps.count("login") == 4  # a fresh login each try: ECR tokens expire
    # the image's user, the health gate, then the job
    assert steps[-5:] == ["pull", "rm", "run", "run", "run"]


@pytest.mark.parametrize("image_user", ["1000:1000", "0:0"])
def test_state_directories_belong_to_the_images_user(tmp_path, image_user):
    # The container writes checkpoints and metrics through bind mounts of host
    # directories: owned by root, a non-root image could not write them.
    result, calls, root = run_training_script(
        tmp_path, node(), driver="595.91.07", image_user=image_user
    )
    assert result.returncode == 0, result.stdout + result.stderr
    query = (calls / "docker-user-query").read_text().splitlines()
    assert IMAGE in query
    uid, gid = image_user.split(":")
    state = f"{root}{userdata.STATE_DIR}"
    assert (
        f"-d -o {uid} -g {gid} {state}/checkpoints {state}/output"
        in (calls / "install").read_text()
    )


def test_the_node_is_handed_to_the_job_watcher_with_the_image_and_its_options(tmp_path):
    result, calls, root = run_training_script(tmp_path, node(), driver="595.91.07")
    assert result.returncode == 0, result.stdout + result.stderr
    watcher = (calls / "watcher").read_text().splitlines()
    assert watcher[0] == IMAGE
    assert watcher[1:4] == ["--name", "gpu-training", "--rm"]
    assert f"{root}/etc/gpu-stack/training.env" in watcher


def host_calls(calls: Path) -> list[str]:
    return (calls / "host").read_text().splitlines() if (calls / "host").exists() else []


@pytest.mark.parametrize("exit_code", [1, 2, 75])
def test_an_unfinished_job_leaves_the_node_running(tmp_path, exit_code):
    result, calls, _ = run_training_script(
        tmp_path, node(), driver="595.91.07", exit_code=exit_code
    )
    assert result.returncode == exit_code
    assert not any(line.startswith("shutdown") for line in host_calls(calls))


def test_gpu_metrics_stop_during_sync_and_pull_and_start_right_before_the_job(tmp_path):
    """Boot, data sync and image pull publish no GPU metrics, so they never read as idle."""
    result, calls, _ = run_training_script(tmp_path, node(), driver="595.91.07")
    assert result.returncode == 0, result.stderr
    metrics = [line for line in host_calls(calls) if line.startswith("gpu-metrics.sh")]
    assert metrics == ["gpu-metrics.sh stop", "gpu-metrics.sh start"]
    docker = (calls / "docker").read_text().splitlines()
    assert docker[-1] == "run" and "pull" in docker  # the job started after the pull


FAKE_RAID_TOOL = """#!/bin/bash
echo "$(basename "$0") $*" >> "$CALLS/raid"
case "$(basename "$0")" in
  mdadm) [ "$1" != --assemble ] || [ -n "$ARRAY_SURVIVED" ] ;;
  blkid) [ -n "$ARRAY_SURVIVED" ] ;;
  mountpoint) exit 1 ;;
  df) printf 'Size\\n 7.0T\\n' ;;
esac
"""


def run_scratch_script(tmp_path: Path, drives: int, *, expected: int = 8, survived: bool = False):
    """Run prepare-scratch.sh over a fake /sys/block with `drives` instance-store NVMe drives."""
    sys_block = tmp_path / "sys-block"
    models = {"nvme0n1": "Amazon Elastic Block Store"}  # the root volume: never touched
    models |= {f"nvme{i}n1": "Amazon EC2 NVMe Instance Storage" for i in range(1, drives + 1)}
    for device, model in models.items():
        (sys_block / device / "device").mkdir(parents=True)
        (sys_block / device / "device" / "model").write_text(model + "\n")
    script = render_files(node(instance_store_drives=expected))[
        f"{userdata.BIN_DIR}/prepare-scratch.sh"
    ]
    script = script.replace("SYS_BLOCK=/sys/block", f"SYS_BLOCK={sys_block}")
    script = script.replace(f'"{userdata.SCRATCH_DIR}"', f'"{tmp_path / "scratch"}"')
    (tmp_path / "prepare-scratch.sh").write_text(script)
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls"
    bin_dir.mkdir()
    calls.mkdir()
    for tool in ("mdadm", "blkid", "mkfs.ext4", "mount", "mountpoint", "df"):
        (bin_dir / tool).write_text(FAKE_RAID_TOOL)
        (bin_dir / tool).chmod(stat.S_IRWXU)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "CALLS": str(calls)}
    if survived:
        env["ARRAY_SURVIVED"] = "1"
    result = subprocess.run(
        ["bash", str(tmp_path / "prepare-scratch.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    raid = (calls / "raid").read_text().splitlines() if (calls / "raid").exists() else []
    return result, raid


def test_scratch_after_a_stop_recreates_raid0_over_the_instance_store(tmp_path):
    result, raid = run_scratch_script(tmp_path, drives=8)
    assert result.returncode == 0, result.stdout + result.stderr
    drives = " ".join(f"/dev/nvme{i}n1" for i in range(1, 9))
    assert (
        f"mdadm --create /dev/md/scratch --run --force --level=0 --raid-devices=8 {drives}" in raid
    )
    assert any(line.startswith("mkfs.ext4 ") and "/dev/md/scratch" in line for line in raid)
    assert f"mount -o noatime /dev/md/scratch {tmp_path / 'scratch'}" in raid
    assert not any("nvme0n1" in line for line in raid)


def test_scratch_after_a_reboot_reassembles_without_formatting(tmp_path):
    result, raid = run_scratch_script(tmp_path, drives=8, survived=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert any(line.startswith("mdadm --assemble /dev/md/scratch") for line in raid)
    assert not any("--create" in line or line.startswith("mkfs") for line in raid)
    assert f"mount -o noatime /dev/md/scratch {tmp_path / 'scratch'}" in raid


def test_scratch_says_when_fewer_drives_than_the_catalog_appear(tmp_path):
    result, raid = run_scratch_script(tmp_path, drives=6, expected=8)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "found 6 instance-store drives, the catalog says 8" in result.stdout
    assert any("--raid-devices=6" in line for line in raid)


def test_scratch_without_instance_store_stays_on_the_root_volume(tmp_path):
    result, raid = run_scratch_script(tmp_path, drives=0, expected=0)
    assert result.returncode == 0, result.stderr
    assert "no instance-store NVMe drive found" in result.stdout
    assert (tmp_path / "scratch").is_dir()
    assert not any(line.startswith(("mdadm", "mkfs", "mount ")) for line in raid)


# --- the seam with the trainer (docs/contracts.md, section 3) ------------------------------

# Variables read by the libraries inside the container rather than by the trainer.
LIBRARY_PREFIXES = ("AWS_", "NCCL_", "FI_", "RDMAV_", "HF_")


def trainer_variables() -> set[str]:
    """Every TRAIN_* name the training package's code reads: mentions as a whole string
    outside the contract module, whose table only lists them."""
    names = set()
    for source in (Path(__file__).parents[3] / "training").rglob("*.py"):
        if source.name == "contract.py":
            continue
        for item in ast.walk(ast.parse(source.read_text())):
            if isinstance(item, ast.Constant) and re.fullmatch(
                r"TRAIN_[A-Z0-9_]+", str(item.value)
            ):
                names.add(item.value)
    return names


def boot_environment(boot: NodeBoot) -> dict[str, str]:
    """The container's environment as the boot writes it (docker --env-file lines)."""
    lines = render_files(boot)[userdata.ENV_FILE].splitlines()
    return dict(line.split("=", 1) for line in lines)


@pytest.mark.parametrize("shape", SHAPES)
def test_every_variable_the_boot_passes_is_one_the_container_reads(shape):
    env = boot_environment(SHAPES[shape])
    unknown = {
        name
        for name in env
        if not name.startswith(LIBRARY_PREFIXES) and name not in trainer_variables()
    }
    assert not unknown, f"the trainer reads none of {sorted(unknown)}"


def test_contract_table_lists_exactly_the_variables_the_trainer_reads():
    contracts = (Path(__file__).parents[3] / "docs" / "contracts.md").read_text()
    section = contracts.split("## 3.")[1].split("## 4.")[0]
    documented = set(re.findall(r"^\| `(TRAIN_[A-Z0-9_]+)` \|", section, flags=re.MULTILINE))
    assert documented == trainer_variables()
    assert set(contract.ENV) == trainer_variables()


def test_a_boot_script_comment_changes_no_byte_of_the_user_data(tmp_path, monkeypatch):
    """Whole-line comments never reach the node: rewording one replaces no instance."""
    before = render_user_data(node())
    templates = tmp_path / "templates"
    shutil.copytree(userdata.TEMPLATES, templates)
    for name in ("run-training.sh", "watch-jobs.py", userdata.UNIT_NAME):
        path = templates / name
        lines = path.read_text().splitlines(keepends=True)
        path.write_text("".join([lines[0], "# a reworded explanation\n", *lines[1:]]))
    monkeypatch.setattr(userdata, "TEMPLATES", templates)
    assert render_user_data(node()) == before
    (templates / "run-training.sh").write_text(
        (templates / "run-training.sh").read_text() + "true\n"
    )
    assert render_user_data(node()) != before  # a real change still reaches it
