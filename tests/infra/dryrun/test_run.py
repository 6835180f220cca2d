"""The offline plan: the real program under mocks, as `python -m infra plan --resources` shows."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from infra.cli import main
from infra.config.stack_file import stack_file_config
from infra.dryrun.report import describe_run
from infra.dryrun.runner import run_stack_file
from tests.support.infra import (
    data_file_cluster_idle_usd_per_hour,
    data_file_head_node,
    data_file_prices,
    run_cli,
)

REPO = Path(__file__).resolve().parents[3]
# Each profile's instance type (infra/knowledge/data/profiles.toml).
PROFILE_TYPES = {
    "l4x1": "g6.2xlarge",
    "l40sx4": "g6e.12xlarge",
    "a100x8-80g": "p4de.24xlarge",
    "a100x8": "p4d.24xlarge",
}
# The AMI every profile's GPU gets: DLAMI Base OSS Nvidia Driver GPU AMI, Amazon Linux 2023
# ("Finding the ID of a DLAMI", docs.aws.amazon.com/dlami/latest/devguide/find-dlami-id.html).
AL2023_DLAMI = (
    "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-amazon-linux-2023"
    "/latest/ami-id"
)


@pytest.mark.parametrize("profile", tuple(PROFILE_TYPES))
def test_every_profile_has_a_stack_file_that_runs(profile):
    path = REPO / f"Pulumi.{profile}.yaml"
    config = stack_file_config(path)
    assert config["gpu:profile"] == profile
    run = run_stack_file(path)
    assert run.outputs["instance_type"] == PROFILE_TYPES[profile]
    assert len(run.outputs["instance_ids"]) == 1  # every profile is one node


def test_describe_lists_resources_and_key_properties():
    run = run_stack_file(REPO / "Pulumi.a100x8.yaml")
    text = describe_run(run)
    assert f"{len(run.resources)} resources" in text
    assert f"ami=resolve:ssm:{AL2023_DLAMI}" in text
    assert "imds=required" in text and "encrypted=true" in text
    assert "aws.ec2.Instance" in text
    assert "inbound=none" in text
    assert f"image: {run.outputs['image_uri']}" in text


def test_plan_resources_for_the_main_job_prints_plan_costs_and_resources():
    result = run_cli("plan", "a100x8", "--resources")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    lines = out.splitlines()
    assert lines[0] == "stack file     Pulumi.a100x8.yaml"
    assert "aws.ec2.LaunchTemplate" in out
    # The resolved plan, as plain `plan a100x8` prints it: the AMI family and its driver
    # (infra/knowledge/data/amis.toml, from the DLAMI release notes), the variant whose CUDA
    # 13.0 needs driver 580.65.06 (images/matrix.toml, CUDA release notes).
    for line in (
        "instance       1 x p4d.24xlarge",
        "GPUs           8 x A100 40 GiB (compute capability 8.0, NVSwitch)",
        "AMI family     dlami-base-oss-al2023 (Amazon Linux 2023, end of life 2029-06-30)",
        f"SSM parameter  {AL2023_DLAMI}",
        "driver         595.91.07 (open; image needs >= 580.65.06)",
        "image tag      0.1.0-torch2.13.0-cu130-py3.12",
    ):
        assert line in lines
    assert any(line.startswith("image variant  cu130 (") for line in lines)
    # The costs, from the catalog's prices and the stack file's budget.
    budget = yaml.safe_load((REPO / "Pulumi.a100x8.yaml").read_text())["config"]["gpu:budgetUsd"]
    p4d = data_file_prices("p4d.24xlarge")
    on_demand, spot = p4d.on_demand_usd_per_hour, p4d.spot_usd_per_hour
    assert any(line.startswith(f"on-demand      ${on_demand:.2f}/h") for line in lines)
    assert any(line.startswith(f"spot           ${spot:.2f}/h") for line in lines)
    assert f"market         on-demand: ${on_demand:.2f}/h for the stack" in lines
    assert f"budget         ${budget:,.2f} a month" in lines
    assert (
        f"runway         {budget / on_demand:.1f} h a month at full load on-demand "
        f"(on-demand {budget / on_demand:.1f} h, spot {budget / spot:.1f} h)"
    ) in lines
    hours = yaml.safe_load((REPO / "Pulumi.a100x8.yaml").read_text())["config"][
        "gpu:maxRuntimeHours"
    ]
    assert (
        f"longest run    ${hours * on_demand:,.2f} on-demand: gpu:maxRuntimeHours stops each "
        f"node after {hours:g} h"
    ) in lines


def test_plan_resources_prices_a_stack_file_that_changes_the_plan(tmp_path, capsys):
    stack = tmp_path / "Pulumi.small.yaml"
    stack.write_text(
        "config:\n  gpu:profile: l4x1\n  gpu:spot: true\n  gpu:instanceType: g5.xlarge\n"
        "  gpu:budgetUsd: 5\n  gpu:budgetPeriod: DAILY\n  gpu:maxRuntimeHours: 12\n"
        "  gpu:alertEmails: [ml@example.com]\n"
    )
    assert main(["plan", "--resources", "--stack-file", str(stack)]) == 0
    lines = capsys.readouterr().out.splitlines()
    g5 = data_file_prices("g5.xlarge")
    on_demand, spot = g5.on_demand_usd_per_hour, g5.spot_usd_per_hour
    assert lines[0] == "stack file     Pulumi.small.yaml"
    # Another instance type is not the l4x1 profile: its description would not hold.
    assert not any(line.startswith("profile ") for line in lines)
    assert "instance       1 x g5.xlarge" in lines
    assert f"market         spot: ${spot:.2f}/h for the stack" in lines
    assert f"budget         $5.00 a day (${5 * 365 / 12:,.2f} a month)" in lines
    # Under a day's 24 h in both markets (a bigger budget's runway stops at 24 h).
    assert (
        f"runway         {5 / spot:.1f} h a day at full load spot "
        f"(on-demand {5 / on_demand:.1f} h, spot {5 / spot:.1f} h)"
    ) in lines
    assert (
        f"longest run    ${12 * spot:,.2f} spot: gpu:maxRuntimeHours stops each node after 12 h"
    ) in lines
    assert sum(line.startswith("  aws.ec2.Instance ") for line in lines) == 1


def test_plan_resources_refuses_more_nodes_without_the_cluster_in_one_line(tmp_path):
    stack = tmp_path / "Pulumi.two.yaml"
    stack.write_text("config:\n  gpu:profile: a100x8\n  gpu:nodes: 2\n")
    result = run_cli("plan", "--resources", "--stack-file", str(stack))
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0
    assert "gpu:nodes is 2" in result.stderr and "gpu:cluster: slurm" in result.stderr
    assert "Traceback" not in result.stderr
    assert "aws.ec2.Instance" not in result.stdout


def test_plan_resources_reports_bad_stack_config_in_one_line(tmp_path):
    stack = tmp_path / "Pulumi.bad.yaml"
    stack.write_text("config:\n  gpu:profile: a100x8\n  gpu:spot: maybe\n")
    result = run_cli("plan", "--resources", "--stack-file", str(stack))
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0
    assert "gpu:spot is 'maybe'" in result.stderr
    assert "Traceback" not in result.stderr


def test_plan_resources_refuses_a_training_config_the_stacks_gpus_cannot_run(tmp_path):
    job = tmp_path / "job.toml"
    job.write_text("[precision]\nbf16 = true\n")
    stack = tmp_path / "Pulumi.old.yaml"
    stack.write_text(
        "config:\n  gpu:instanceType: p3.2xlarge\n  gpu:budgetUsd: 100\n"
        f"  gpu:alertEmails: [ml@example.com]\n  gpu:trainConfig: {job}\n"
    )
    result = run_cli("plan", "--resources", "--stack-file", str(stack))
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0
    assert result.stderr.startswith(f"error: Pulumi.old.yaml: gpu:trainConfig is {str(job)!r}")
    assert "precision.bf16 = true needs compute capability 8.0" in result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""


def test_plan_without_resources_lists_no_resources():
    result = run_cli("plan", "a100x8")
    assert result.returncode == 0, result.stderr
    assert "aws.ec2.LaunchTemplate" not in result.stdout
    assert "p4d.24xlarge" in result.stdout


def test_the_example_stack_files_placeholder_address_is_pointed_out():
    result = run_cli("plan", "a100x8", "--resources")
    assert result.returncode == 0, result.stderr
    (line,) = [line for line in result.stdout.splitlines() if "gpu:alertEmails" in line]
    assert line.startswith("warning ") and "you@example.com" in line


def test_a_stack_file_in_eu_west_1_prints_eu_west_1_prices(tmp_path, capsys):
    stack = tmp_path / "Pulumi.ireland.yaml"
    stack.write_text(
        "config:\n  aws:region: eu-west-1\n  gpu:profile: a100x8\n  gpu:budgetUsd: 2000\n"
        "  gpu:alertEmails: [ml@example.com]\n"
    )
    assert main(["plan", "--resources", "--stack-file", str(stack)]) == 0
    out = capsys.readouterr().out
    # p4d.24xlarge in eu-west-1: $23.71569/h as observed after the June 2025 cut (prices.toml's
    # source, the post-cut SkyPilot catalog), not us-east-1's $21.96.
    assert "market         on-demand: $23.72/h for the stack" in out.splitlines()
    assert "prices         eu-west-1, checked 2026-12-01; CNY at 7.1 per USD (2025-12-31)" in out


def test_a_missing_stack_file_names_the_profiles_that_have_one():
    result = run_cli("plan", "no-such-profile", "--resources")
    assert result.returncode == 2
    stack_files = REPO.glob("Pulumi.*.yaml")
    for name in (path.name.removeprefix("Pulumi.").removesuffix(".yaml") for path in stack_files):
        assert name in result.stderr


def test_plan_resources_shows_what_the_stack_costs_with_no_job(tmp_path):
    # One stopped p4d keeps its 500 GiB gp3 root volume: 500 x $0.08 = $40.00 a month; the
    # bucket at $0.023 per GB-month is $2.30 a month per 100 GiB.
    result = run_cli("plan", "a100x8", "--resources")
    assert result.returncode == 0, result.stderr
    assert (
        "idle           $40.00 a month with no job running (root volumes $40.00, network "
        "$0.00), plus $2.30 a month per 100 GiB of checkpoints kept"
    ) in result.stdout.splitlines()
    # A cluster: the head node runs all the time; compute nodes exist only for a job.
    stack_file = tmp_path / "Pulumi.cluster.yaml"
    stack_file.write_text(
        "config:\n  aws:region: us-east-1\n  gpu:profile: a100x8\n  gpu:nodes: 2\n"
        "  gpu:cluster: slurm\n  gpu:alertEmails: [ml@example.com]\n  gpu:budgetUsd: 500\n"
    )
    result = run_cli("plan", "--resources", "--stack-file", str(stack_file))
    assert result.returncode == 0, result.stderr
    # Its private subnet's NAT gateway and the gateway's address bill all the time too.
    head = data_file_head_node("us-east-1").on_demand_usd_per_hour * 730
    network = data_file_cluster_idle_usd_per_hour("us-east-1") * 730 - head
    assert (
        f"idle           ${head + network:,.2f} a month with no job running (head node "
        f"${head:,.2f}, network ${network:,.2f}), plus $2.30 a month per 100 GiB of "
        "checkpoints kept"
    ) in result.stdout.splitlines()
