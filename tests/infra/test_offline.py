"""The offline plan: the real program under mocks, as `python -m infra plan --resources` shows."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from infra.offline import describe_run, run_stack_file, stack_file_config
from infra.profiles import load_profiles, resolve_profile

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("profile", tuple(load_profiles().profiles))
def test_every_profile_has_a_stack_file_that_runs(profile):
    path = REPO / f"Pulumi.{profile}.yaml"
    config = stack_file_config(path)
    assert config["gpu:profile"] == profile
    run = run_stack_file(path)
    plan = resolve_profile(profile)
    assert run.outputs["instance_type"] == plan.instance.type
    assert len(run.outputs["instance_ids"]) == plan.nodes


def test_describe_lists_resources_key_properties_and_cost():
    run = run_stack_file(REPO / "Pulumi.a100x8.yaml")
    text = describe_run(run)
    plan = resolve_profile("a100x8")
    assert f"{len(run.resources)} resources" in text
    assert f"ami=resolve:ssm:{plan.ami.ssm_parameter}" in text
    assert "imds=required" in text and "encrypted=true" in text
    assert "aws.ec2.Instance" in text and "TRAIN_NODE_RANK=0" in text
    assert "inbound=none" in text
    assert f"${plan.on_demand_usd_per_hour:.2f}/h" in text


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "infra", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_plan_resources_for_the_main_job():
    result = run_cli("plan", "a100x8", "--resources")
    assert result.returncode == 0, result.stderr
    assert "stack file Pulumi.a100x8.yaml" in result.stdout
    assert "aws.ec2.LaunchTemplate" in result.stdout
    plan = resolve_profile("a100x8")
    assert f"1 x p4d.24xlarge (on-demand): ${plan.on_demand_usd_per_hour:.2f}/h" in result.stdout


def test_plan_resources_reports_bad_stack_config_in_one_line(tmp_path):
    stack = tmp_path / "Pulumi.bad.yaml"
    stack.write_text("config:\n  gpu:profile: a100x8\n  gpu:spot: maybe\n")
    result = run_cli("plan", "--resources", "--stack-file", str(stack))
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0
    assert "gpu:spot is 'maybe'" in result.stderr
    assert "Traceback" not in result.stderr


def test_plan_without_resources_is_unchanged():
    result = run_cli("plan", "a100x8")
    assert result.returncode == 0, result.stderr
    assert "aws.ec2.LaunchTemplate" not in result.stdout
    assert "p4d.24xlarge" in result.stdout
