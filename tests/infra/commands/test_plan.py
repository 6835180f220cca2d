"""`python -m infra plan` as a user runs it: a subprocess, its output and exit status."""

from pathlib import Path

import pytest
import yaml

from images.matrix import MATRIX_PATH
from infra import cli
from infra.commands import plan
from tests.support.infra import (
    data_file_cluster_idle_usd_per_hour,
    data_file_head_node,
    data_file_prices,
    modified_catalog,
    run_cli,
)

REPO = Path(__file__).resolve().parents[3]


def test_default_profile_prints_the_plan():
    result = run_cli("plan")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "a100x8" in out and "1 x p4d.24xlarge" in out and "8 x A100 40 GiB" in out
    assert (
        "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-amazon-linux-2023"
        "/latest/ami-id" in out
    )
    assert "$21.96/h" in out and "$14.11/h" in out  # on-demand and spot
    assert "0.1.0-torch2.13.0-cu130-py3.12" in out and "595.91.07" in out
    assert "upper bound" not in out  # priced after the June 2025 cut


def test_profile_plan_adds_the_budget_and_runway_of_its_stack_file():
    result = run_cli("plan", "a100x8")
    assert result.returncode == 0, result.stderr
    config = yaml.safe_load((REPO / "Pulumi.a100x8.yaml").read_text())["config"]
    budget, on_demand = config["gpu:budgetUsd"], not config["gpu:spot"]
    p4d = data_file_prices("p4d.24xlarge", config["aws:region"])
    assert on_demand
    lines = result.stdout.splitlines()
    assert "stack file     Pulumi.a100x8.yaml" in lines
    assert f"market         on-demand: ${p4d.on_demand_usd_per_hour:.2f}/h for the stack" in lines
    assert f"budget         ${budget:,.2f} a month" in lines
    assert (
        f"runway         {budget / p4d.on_demand_usd_per_hour:.1f} h a month at full load "
        f"on-demand (on-demand {budget / p4d.on_demand_usd_per_hour:.1f} h, "
        f"spot {budget / p4d.spot_usd_per_hour:.1f} h)"
    ) in lines


def test_stack_file_that_changes_the_profiles_plan_is_not_priced_as_the_profile(
    tmp_path, monkeypatch, capsys
):
    (tmp_path / "Pulumi.a100x8.yaml").write_text(
        "config:\n  gpu:profile: a100x8\n  gpu:instanceType: p4de.24xlarge\n  gpu:budgetUsd: 5000\n"
        "  gpu:alertEmails: [ml@example.com]\n"
    )
    monkeypatch.setattr(plan, "stack_file_path", lambda name: tmp_path / f"Pulumi.{name}.yaml")
    assert cli.main(["plan", "a100x8"]) == 0
    out = capsys.readouterr().out
    assert "Pulumi.a100x8.yaml runs 1 x p4de.24xlarge (cu130)" in out
    assert "--resources` prices that stack" in out
    assert "runway" not in out


def test_profile_without_a_stack_file_prints_no_costs(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(plan, "stack_file_path", lambda name: tmp_path / f"Pulumi.{name}.yaml")
    assert cli.main(["plan", "a100x8"]) == 0
    out = capsys.readouterr().out
    assert "1 x p4d.24xlarge" in out and "stack file" not in out and "runway" not in out


def test_l4x1_shows_the_guide_row_it_answers_and_that_its_v100_is_gone():
    result = run_cli("plan", "l4x1")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "instance       1 x g6.2xlarge" in lines
    assert (
        "guide row      small image classification on 1x V100 16GB, 8-12 CNY/h "
        "(GPU-cloud selection guide)"
    ) in lines
    gone = [line for line in lines if line.startswith("guide hardware ")]
    assert len(gone) == 1 and "p3.2xlarge" in gone[0] and "past end of life" in gone[0]


def test_a_v100_stays_plannable_with_its_end_of_life_warning():
    result = run_cli("plan", "--instance", "p3.2xlarge")
    assert result.returncode == 0, result.stderr
    assert "base-proprietary-nvidia-driver" in result.stdout
    assert "past end of life" in result.stdout


def test_instance_variant_nodes_instead_of_a_profile():
    result = run_cli("plan", "--instance", "g5.xlarge", "--variant", "cu128", "--nodes", "2")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    # Two g5.xlarge in us-east-1: 2 x $1.006 on-demand, 2 x $0.507 spot (prices.toml).
    assert "2 x g5.xlarge" in out and "$2.01/h" in out and "$1.01/h" in out
    assert "cu128" in out and "no EFA" in out


@pytest.mark.parametrize("region", ["us-east-1", "eu-west-1"])
def test_more_than_one_node_plans_the_slurm_cluster_and_its_idle_cost_in_the_region(region):
    head_node = data_file_head_node(region)
    result = run_cli("plan", "a100x8", "--nodes", "2", "--region", region)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "2 x p4d.24xlarge" in out
    assert "Slurm on AWS ParallelCluster 3.15.1" in out
    assert "queue          gpu: 0 to 2 x p4d.24xlarge" in out
    price = f"${head_node.on_demand_usd_per_hour:.3f}/h"
    assert f"head node      {head_node.instance_type} on-demand, {price} in {region}" in out
    idle = data_file_cluster_idle_usd_per_hour(region)
    assert f"idle cost      ${idle:.3f}/h (head node and network" in out
    assert "AMI family" not in out  # the nodes boot ParallelCluster's AMIs, not the DLAMI


def test_an_older_cluster_release_plans_the_newest_variant_its_driver_runs():
    result = run_cli("plan", "a100x8", "--nodes", "2", "--parallelcluster", "3.14.0")
    assert result.returncode == 0, result.stderr
    assert "image variant  cu128" in result.stdout
    assert "driver 570.172.08; image needs >= 570.26" in result.stdout


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("plan", "a100x3"), "unknown profile 'a100x3'"),
        (("plan", "--instance", "p9.huge"), "unknown instance type 'p9.huge'"),
        (("plan", "--instance", "p4d.24xlarge", "--variant", "cu99"), "unknown image variant"),
        (("plan", "--instance", "p3.2xlarge", "--variant", "cu130"), "CUDA 13 dropped"),
        (("plan", "--instance", "p3.2xlarge", "--variant", "cpu"), "'cpu' has no CUDA"),
        (
            ("plan", "--instance", "p4d.24xlarge", "--nodes", "0"),
            "--nodes 0: give a whole number from 1 to 256",
        ),
        (
            ("plan", "--instance", "p4d.24xlarge", "--nodes", "100000"),
            "--nodes 100000: give a whole number from 1 to 256",
        ),
        # Checked as typed, before what they combine with (a profile sets its own).
        (("plan", "a100x8", "--nodes", "0"), "--nodes 0: give a whole number from 1 to 256"),
        (("plan", "--variant", "cu999"), "--variant 'cu999': unknown image variant"),
        (("plan", ""), "profile name is '' (empty)"),
        (("offers", "--max-price", "nan"), "--max-price is nan"),
        (("plan", "--resources", "--stack-file", "/"), "no stack file /: give a profile"),
        (("plan", "--instance", "p4d.24xlarge", "--nodes", "two"), "--nodes: invalid int"),
        (("plan", "l4x1", "--instance", "p3.2xlarge"), "not both"),
        (("plan", "l4x1", "--nodes", "1"), "go with --instance"),
        (("plan", "l4x1", "--variant", "cu128", "--nodes", "2"), "goes with --instance"),
        (
            (
                *("plan", "--instance", "p4d.24xlarge", "--variant", "cu130"),
                *("--nodes", "2", "--parallelcluster", "3.14.0"),
            ),
            "ParallelCluster 3.14.0's AMIs carry 570.172.08",
        ),
        (("plan", "a100x8", "--parallelcluster", "2.11.0"), "use one of 3.14.0, 3.15.1"),
        (("deploy",), "invalid choice: 'deploy'"),
        (("plan", "--profiles", "/nonexistent/profiles.toml"), "file not found"),
        (("plan", "--profiles", "/"), "/ is a folder: give the TOML file"),
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
        tmp_path, "prices.toml", "on_demand_usd_per_hour = 3.06", "on_demand_usd_per_hour = -1"
    )
    result = run_cli("plan", "--catalog", str(directory))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1
    assert "type 'p3.2xlarge', field 'on_demand_usd_per_hour'" in result.stderr


def test_bad_matrix_file_is_one_line_exit_2(tmp_path):
    bad = tmp_path / "matrix.toml"
    bad.write_text(MATRIX_PATH.read_text().replace('nccl = "2.27.5"', 'nccl = "2.26.2"', 1))
    result = run_cli("plan", "--matrix", str(bad))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1
    assert "variant 'cu128', field 'nccl'" in result.stderr


def test_plan_prices_the_region_asked_for_and_refuses_one_without_prices():
    ireland = run_cli("plan", "a100x8", "--region", "eu-west-1")
    assert ireland.returncode == 0, ireland.stderr
    # p4d.24xlarge in eu-west-1: $23.71569/h (the SkyPilot AWS catalog's eu-west-1 row,
    # prices.toml's source), not us-east-1's $21.96.
    assert any(line.startswith("on-demand      $23.72/h") for line in ireland.stdout.split("\n"))
    assert "prices         eu-west-1, checked " in ireland.stdout
    missing = run_cli("plan", "a100x8", "--region", "eu-west-3")
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1
    assert "'eu-west-3'" in missing.stderr and "eu-west-1, us-east-1, us-west-2" in missing.stderr


def test_plan_prints_the_worst_case_overspend_beside_budget_and_runway():
    result = run_cli("plan", "a100x8")
    # p4d.24xlarge on-demand in us-east-1: $21.96/h (AWS What's New 2025-06-05, after the
    # June 2025 cut). One 5-minute guard period plus a 60-second run: 21.96 * 6 / 60.
    bound = 2.196
    lines = result.stdout.splitlines()
    runway = next(i for i, line in enumerate(lines) if line.startswith("runway "))
    assert lines[runway + 1].startswith(f"overspend      at most ${bound:,.2f} past the budget")


CAPACITY_BLOCK_STACK = (
    "config:\n  aws:region: us-east-1\n  gpu:profile: a100x8\n"
    "  gpu:capacityBlockId: cr-0123456789abcdef0\n"
    "  gpu:alertEmails: [ml@example.com]\n  gpu:budgetUsd: {budget}\n"
)
# $/h in us-east-1, below p4d's $21.96 on-demand (EC2 Capacity Blocks for ML pricing page,
# aws.amazon.com/ec2/capacityblocks/pricing/, as of 2026-07-22).
P4D_CAPACITY_BLOCK_RATE = 11.80


def test_a_capacity_block_stack_is_planned_and_budget_checked_at_the_blocks_price(
    tmp_path, monkeypatch, capsys
):
    stack_file = tmp_path / "Pulumi.a100x8.yaml"
    monkeypatch.setattr(plan, "stack_file_path", lambda name: tmp_path / f"Pulumi.{name}.yaml")
    # $18 buys more than an hour of the block, less than an hour on demand.
    stack_file.write_text(CAPACITY_BLOCK_STACK.format(budget=18))
    assert cli.main(["plan", "a100x8"]) == 0
    out = capsys.readouterr().out
    assert f"market         capacity-block: ${P4D_CAPACITY_BLOCK_RATE:.2f}/h for the stack" in out
    assert cli.main(["plan", "--resources", "--stack-file", str(stack_file)]) == 0
    out = capsys.readouterr().out
    assert "never stops its nodes" in out and "overspend      none" in out
    # $10 is less than one hour of the block: refused, naming the block's price.
    stack_file.write_text(CAPACITY_BLOCK_STACK.format(budget=10))
    assert cli.main(["plan", "--resources", "--stack-file", str(stack_file)]) == 2
    err = capsys.readouterr().err
    assert f"less than one hour of this stack at ${P4D_CAPACITY_BLOCK_RATE:.2f}/h" in err


def test_a_capacity_block_of_a_type_without_a_block_price_is_refused_at_preview(tmp_path, capsys):
    stack_file = tmp_path / "Pulumi.l4x1.yaml"
    stack_file.write_text(CAPACITY_BLOCK_STACK.format(budget=500).replace("a100x8", "l4x1"))
    assert cli.main(["plan", "--resources", "--stack-file", str(stack_file)]) == 2
    err = capsys.readouterr().err
    assert "no capacity-block price for g6.2xlarge in us-east-1" in err


HF_JOB = """[model]
hf = "{model}"
activation_checkpointing = true
[data]
kind = "jsonl"
path = "/no/such/data.jsonl"
seq_len = 4096
[train]
micro_batch_size = 1
[zero]
stage = 3
[precision]
bf16 = true
"""


@pytest.mark.slow(
    reason="the estimate imports torch, transformers and DeepSpeed (about 20 s on 2 loaded "
    "cores); the two plans take about 3 s",
    seconds=40,
)
def test_a_hugging_face_job_is_planned_with_its_memory_per_gpu(tmp_path, monkeypatch, capsys):
    """Llama 3.1 8B (its config.json alone) at ZeRO-3 fits 8 x A100 80 GiB and not one L4:
    there `plan` refuses it in one line with the change that fits. Each verdict is the one
    `python -m training estimate` gives for that GPU."""
    from training.estimate import report
    from training.spec.config import load_config

    model = tmp_path / "llama-3.1-8b"
    model.mkdir()
    hub = REPO / "tests" / "training" / "data" / "hub" / "meta-llama" / "Llama-3.1-8B"
    (model / "config.json").write_bytes((hub / "config.json").read_bytes())
    job = tmp_path / "job.toml"
    job.write_text(HF_JOB.format(model=model))
    monkeypatch.setattr(plan, "stack_file_path", lambda name: tmp_path / f"Pulumi.{name}.yaml")

    def plan_with_the_job(profile: str, gpus: int, gpu_type: str) -> tuple[int, str, str, str]:
        stack = yaml.safe_load((REPO / f"Pulumi.{profile}.yaml").read_text())
        stack["config"]["gpu:trainConfig"] = str(job)
        (tmp_path / f"Pulumi.{profile}.yaml").write_text(yaml.safe_dump(stack))
        code = cli.main(["plan", profile])
        out, err = capsys.readouterr()
        estimate = report(load_config(job), gpus=gpus, nodes=1, gpu_type=gpu_type)
        (verdict,) = [
            line.removeprefix("your config  ")
            for line in estimate.splitlines()
            if line.startswith("your config")
        ]
        return code, out, err, verdict

    code, out, err, verdict = plan_with_the_job("a100x8-80g", 8, "A100-80GB")
    assert code == 0, err
    assert verdict.endswith(": fits")
    assert f"memory         {model} on 8 x A100 80 GiB, 72.0 GiB usable: {verdict}" in out

    code, out, err, verdict = plan_with_the_job("l4x1", 1, "L4-24GB")
    assert code == 2 and out == ""
    assert verdict.endswith(": does not fit")
    (line,) = err.splitlines()
    assert line.startswith(f"error: gpu:trainConfig is '{job}': {model} on 1 x L4 24 GiB")
    assert f": {verdict}; " in line and "--set zero.offload" in line
