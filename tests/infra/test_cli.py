"""`python -m infra plan` as a user runs it: a subprocess, its output and exit status."""

import subprocess
import sys
from pathlib import Path

import pytest

from images.matrix import MATRIX_PATH
from tests.infra.helpers import modified_catalog

REPO = Path(__file__).resolve().parents[2]


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "infra", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_default_profile_prints_the_plan():
    result = run_cli("plan")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "a100x8" in out and "1 x p4d.24xlarge" in out and "8 x A100 40 GiB" in out
    assert (
        "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-amazon-linux-2023"
        "/latest/ami-id" in out
    )
    assert "$32.77/h" in out and "$9.90/h" in out  # on-demand and spot
    assert "0.1.0-torch2.13.0-cu130-py3.11" in out and "595.91.07" in out
    assert "upper bound" in out


def test_v100_profile_shows_eol_and_seed_range():
    result = run_cli("plan", "v100x1")
    assert result.returncode == 0, result.stderr
    assert "p3.2xlarge" in result.stdout and "base-proprietary-nvidia-driver" in result.stdout
    assert "past end of life" in result.stdout and "8-12 CNY/h" in result.stdout


def test_instance_variant_nodes_instead_of_a_profile():
    result = run_cli("plan", "--instance", "g5.xlarge", "--variant", "cu126", "--nodes", "2")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "2 x g5.xlarge" in out and "$2.01/h" in out and "$0.60/h" in out
    assert "cu126" in out and "no EFA" in out


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("plan", "a100x3"), "unknown profile 'a100x3'"),
        (("plan", "--instance", "p9.huge"), "unknown instance type 'p9.huge'"),
        (("plan", "--instance", "p4d.24xlarge", "--variant", "cu99"), "unknown image variant"),
        (("plan", "--instance", "p3.2xlarge", "--variant", "cu130"), "CUDA 13 dropped"),
        (("plan", "--instance", "p3.2xlarge", "--variant", "cpu"), "'cpu' has no CUDA"),
        (("plan", "--instance", "p4d.24xlarge", "--nodes", "0"), "nodes must be"),
        (("plan", "--instance", "p4d.24xlarge", "--nodes", "two"), "--nodes: invalid int"),
        (("plan", "v100x1", "--instance", "p3.2xlarge"), "not both"),
        (("plan", "v100x1", "--nodes", "2"), "go with --instance"),
        (("deploy",), "invalid choice: 'deploy'"),
        (("plan", "--profiles", "/nonexistent/profiles.toml"), "file not found"),
    ],
)
def test_bad_input_is_one_line_exit_2(args, expected):
    result = run_cli(*args)
    assert result.returncode == 2
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: ")
    assert expected in result.stderr


def test_bad_catalog_file_is_one_line_exit_2(tmp_path):
    directory = modified_catalog(
        tmp_path, "instances.toml", "on_demand_usd_per_hour = 3.06", "on_demand_usd_per_hour = -1"
    )
    result = run_cli("plan", "--catalog", str(directory))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1
    assert "instance 'p3.2xlarge', field 'on_demand_usd_per_hour'" in result.stderr


def test_bad_matrix_file_is_one_line_exit_2(tmp_path):
    bad = tmp_path / "matrix.toml"
    bad.write_text(MATRIX_PATH.read_text().replace('nccl = "2.27.5"', 'nccl = "2.26.2"', 1))
    result = run_cli("plan", "--matrix", str(bad))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1
    assert "variant 'cu128', field 'nccl'" in result.stderr
