"""The batch script's two forms: the cluster's (the image under Pyxis) and the tests' (the host)."""

from __future__ import annotations

import re
import shlex
import subprocess

import pytest

from infra.cluster.sbatch import BatchJob, Launch, render_sbatch
from tests.support.tools import require_tool
from training.contract import ENV
from training.health.expectation import NodeExpectation

IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/gpu-stack-test-images:1.0-cu128"


def rendered(launch: Launch) -> str:
    return render_sbatch(
        BatchJob(nodes=2, launch=launch, checkpoint_root="/scratch/checkpoints", s3_root="s3://b/c")
    )


CLUSTER_LAUNCH = Launch.container(IMAGE, {"/scratch": "/scratch", "/home": "/home"})
CLUSTER = rendered(CLUSTER_LAUNCH)
HOST = rendered(Launch.host("/usr/bin/python3"))


def test_the_two_forms_differ_only_in_the_launch_prefix():
    options = shlex.join(CLUSTER_LAUNCH.srun_options)
    # Three launches: the health gate's step, the fabric check's, then the training step.
    as_host = (
        CLUSTER.replace(options, "", 3)
        .replace(" python -m training health", " /usr/bin/python3 -m training health", 1)
        .replace(" python -m training fabric", " /usr/bin/python3 -m training fabric", 1)
        .replace(' python -m training "$@"', ' /usr/bin/python3 -m training "$@"', 1)
    )
    assert as_host == HOST
    assert "--container-mounts=/scratch:/scratch,/home:/home" in CLUSTER
    assert "/usr/bin/python3 -m training" in HOST and ' python -m training "$@"' in CLUSTER


def srun_lines(script: str) -> list[str]:
    """Each srun command of the script, its continuation lines joined."""
    joined = script.replace("\\\n", " ")
    return [line.strip() for line in joined.splitlines() if re.search(r"(^|\s)srun\s", line)]


def test_both_container_steps_use_one_named_container():
    """The health gate, the fabric check and the training step run in one container per
    node: named, so Pyxis imports and unpacks the image once per job and node
    (infra/cluster/sbatch.py)."""
    in_image = [line for line in srun_lines(CLUSTER) if "--container-image=" in line]
    assert len(in_image) == 3  # the gate, the fabric check, the launchers
    names = {re.search(r"--container-name=(\S+)", line).group(1) for line in in_image}
    assert names == {"train"}
    # The verdict step runs on the host, outside any container.
    (verdict,) = [line for line in srun_lines(CLUSTER) if "--nodelist=" in line]
    assert "--container-" not in verdict


def test_the_script_sets_only_variables_the_trainer_reads():
    exported = set(re.findall(r"export (TRAIN_[A-Z0-9_]+)=", CLUSTER))
    assert exported >= {"TRAIN_NNODES", "TRAIN_NODE_RANK", "TRAIN_MASTER_ADDR", "TRAIN_S3_URI"}
    assert exported <= set(ENV)


@pytest.mark.parametrize("script", [CLUSTER, HOST], ids=["cluster", "host"])
def test_the_script_passes_shellcheck(tmp_path, script):
    shellcheck = require_tool("shellcheck", "shellcheck")
    (tmp_path / "train.sbatch").write_text(script)
    result = subprocess.run(
        [shellcheck, str(tmp_path / "train.sbatch")], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout


def test_every_variable_the_script_exports_keeps_the_jobs_value_under_pyxis():
    (names,) = [
        option.removeprefix("--container-env=").split(",")
        for option in CLUSTER_LAUNCH.srun_options
        if option.startswith("--container-env=")
    ]
    exported = set(re.findall(r"export (TRAIN_[A-Z0-9_]+)=", CLUSTER))
    assert exported - {"TRAIN_NODE_RANK"} <= set(names)  # the rank is set inside the container
    assert "TRAIN_CHECKPOINT_DIR" in names
    # The image's own: the oldest driver its CUDA runs on.
    assert "TRAIN_MIN_DRIVER" not in names
    assert f"--container-env={','.join(names)}" in CLUSTER


def test_a_value_that_would_break_the_script_is_refused():
    with pytest.raises(ValueError, match="checkpoint_root"):
        render_sbatch(BatchJob(nodes=2, launch=Launch.host("python"), checkpoint_root='/a"b'))


def test_the_script_warns_before_the_time_limit_and_bounds_crash_restarts():
    # The shell alone gets SIGTERM the cluster's KillWait (120 s) before the time limit.
    assert "\n#SBATCH --signal=B:TERM@120\n" in CLUSTER
    # The single-node boot unit's bound (training/contract.py): 3 restarts in 6 hours.
    assert 'if [ "$crashes" -gt 3 ]; then' in CLUSTER
    assert "-lt 21600 ]" in CLUSTER
    # srun is started outside the batch shell's process tree, never exec'd by it.
    assert "setsid --fork bash -c" in CLUSTER and "exec srun" not in CLUSTER


def test_the_catalog_figures_reach_the_health_gate():
    script = render_sbatch(
        BatchJob(
            nodes=2,
            launch=CLUSTER_LAUNCH,
            checkpoint_root="/scratch/checkpoints",
            expectation=NodeExpectation(gpus=8, gpu_model="A100", busbw_gbps=230.0, efa_devices=4),
        )
    )
    assert (
        "export TRAIN_EXPECT_GPUS=8\nexport TRAIN_EXPECT_GPU_MODEL=A100\n"
        "export TRAIN_EXPECT_BUSBW_GBPS=230.0\nexport TRAIN_EXPECT_EFA=4\n"
    ) in script


FAKE_AWS = """#!/bin/bash
echo "aws $*" >> "$CALLS"
case "$SECRET_STATE" in
  stored) echo hf_sbatchToken ;;
  none) echo "An error occurred (ResourceNotFoundException) ..." >&2; exit 254 ;;
  denied) echo "An error occurred (AccessDeniedException) ..." >&2; exit 254 ;;
esac
"""


@pytest.mark.parametrize("state", ["stored", "none", "denied"])
def test_the_job_reads_the_stacks_hf_token_and_never_prints_it(tmp_path, state):
    script = render_sbatch(
        BatchJob(
            nodes=1,
            launch=CLUSTER_LAUNCH,
            checkpoint_root="/scratch/checkpoints",
            cache_dir="/scratch/cache",
            hf_token_secret="gpu-stack/p-s/hf-token",
            region="eu-west-1",
        )
    )
    # The script's own lines, from the cache folder to the token's export, run as they are.
    part = script[script.index('cache_dir="') : script.index("export_hf_token\n") + 16]
    (tmp_path / "aws").write_text(FAKE_AWS)
    (tmp_path / "aws").chmod(0o755)
    shown = 'echo "token=${HF_TOKEN:-} cache=$TRAIN_CACHE_DIR hub=$HF_HOME"'
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin", "CALLS": str(tmp_path / "calls")}
    done = subprocess.run(
        ["bash", "-c", f"set -euo pipefail\n{part}\n{shown}"],
        env={**env, "SECRET_STATE": state},
        capture_output=True,
        text=True,
        timeout=10,
    )
    assert done.returncode == 0, done.stderr
    *said, seen = done.stdout.splitlines()
    token = "hf_sbatchToken" if state == "stored" else ""
    assert seen == f"token={token} cache=/scratch/cache hub=/scratch/cache/huggingface"
    assert "hf_sbatchToken" not in "".join(said) + done.stderr
    assert said == (
        [
            "slurm: could not read gpu-stack/p-s/hf-token (An error occurred "
            "(AccessDeniedException) ... ): no HF_TOKEN for this job"
        ]
        if state == "denied"
        else []
    )
    assert (tmp_path / "calls").read_text().split() == [
        *["aws", "secretsmanager", "get-secret-value", "--region", "eu-west-1", "--secret-id"],
        "gpu-stack/p-s/hf-token",
        *["--query", "SecretString", "--output", "text"],
    ]
    assert "HF_TOKEN" in CLUSTER_LAUNCH.srun_options[-1]  # Pyxis keeps the job's value
