"""`up` and `preview`: the cost table from the stack file, a yes before anything is created,
and the Automation API calls they make (a stub stack records them)."""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import os
import tomllib

import pytest
import yaml
from pulumi import automation as auto

from infra import cli
from infra.commands import up
from infra.commands.doctor import ProbeError, Probes
from infra.config.schema import load_stack_config
from infra.config.stack_file import REPO_ROOT, load_stack_file
from infra.deployed import stack_image, workspace
from infra.deployed.stack_image import ImageRef
from infra.errors import ConfigError
from infra.knowledge.catalog import CATALOG_DIR
from infra.planning import resolve_plan
from infra.project import WITHOUT_NODES_ENV
from infra.targets.ec2_spool import SpoolDeployment
from tests.infra.commands.conftest import cluster_outputs, stack_outputs

STACK_FILE = yaml.safe_load((REPO_ROOT / "Pulumi.l4x1.yaml").read_text())["config"]
PRICES = tomllib.loads((CATALOG_DIR / "prices.toml").read_text())["region"]
NODE = PRICES[STACK_FILE["aws:region"]]["g6.2xlarge"]
# l4x1's plan, as `up` resolves it: the image tag and variant its nodes pull.
PLAN = resolve_plan(load_stack_file(REPO_ROOT / "Pulumi.l4x1.yaml"), STACK_FILE["aws:region"])


# What renting needs, all there: the Pulumi CLI, credentials, quota to spare.
READY = Probes(
    pulumi_version=lambda: "v3.210.0",
    aws_identity=lambda region: ("123456789012", region),
    quota_vcpus=lambda region, need: 1024.0,
)


def _no_credentials(region):
    raise ProbeError("no AWS credentials found")


def _args(**values):
    return argparse.Namespace(**{"stack": "l4x1", "yes": False, "policy_pack": True, **values})


def test_up_prints_both_markets_and_the_runway_then_asks_before_creating(stub_stack):
    out, asked = io.StringIO(), []
    result = up.run(_args(), out=out, ask=lambda q: asked.append(q) or "n", probes=READY)
    assert result == "nothing was created"
    assert stub_stack.opened == [] and stub_stack.calls == []  # Pulumi was never started
    text = out.getvalue()
    budget = STACK_FILE["gpu:budgetUsd"]
    assert STACK_FILE["gpu:spot"] is True
    spot_row = next(line for line in text.splitlines() if line.startswith("spot *"))
    assert f"${NODE['spot_usd_per_hour']:,.2f}" in spot_row
    assert f"{budget / NODE['spot_usd_per_hour']:,.1f} h" in spot_row
    on_demand_row = next(line for line in text.splitlines() if line.startswith("on-demand"))
    assert f"{budget / NODE['on_demand_usd_per_hour']:,.1f} h" in on_demand_row
    # The spend guard's bound: one 5-minute period plus a 60-second run at the stack's $/h.
    bound = NODE["spot_usd_per_hour"] * (5 + 1) / 60
    assert f"worst case: ${bound:,.2f} past the budget" in text
    assert asked == [
        f"Create or update stack l4x1 at ${NODE['spot_usd_per_hour']:,.2f}/h (spot) while it runs?"
        " [y/N] "
    ]


def test_a_capacity_block_stack_is_described_in_its_market_at_the_blocks_price():
    config = load_stack_config(
        {"capacityBlockId": "cr-0123456789abcdef0", "alertEmails": ["ml@example.com"]}
    )
    text = up.describe("blocks", config, resolve_plan(config, "us-east-1"))
    # p4d.24xlarge Capacity Block, us-east-1: $11.80/h (EC2 Capacity Blocks pricing page,
    # as of 2026-07-22).
    assert text.splitlines()[0].endswith("(8 x A100 40 GiB), capacity-block")
    row = next(line for line in text.splitlines() if line.startswith("capacity-block *"))
    assert row.split()[2] == "$11.80"


def test_a_yes_runs_pulumi_up_on_the_stack_and_streams_its_output(stub_stack):
    stub_stack.outputs_ = stack_outputs(["i-0abc"], spot=False, image_uri="r/repo:tag")
    out = io.StringIO()
    result = up.run(_args(), out=out, ask=lambda q: "y", probes=READY)
    assert stub_stack.opened == [("l4x1", True)]
    (call,) = [c for c in stub_stack.calls if c[0] == "up"]
    assert call[1]["color"] == "never"
    # The guardrail policies run with Pulumi's own up, from the project's pack.
    assert call[1]["policy_packs"] == [str(REPO_ROOT / "policy")]
    assert (REPO_ROOT / "policy" / "PulumiPolicy.yaml").is_file()
    call[1]["on_output"]("Updating (l4x1)")  # Pulumi's lines reach the person as they come
    assert out.getvalue().endswith("Updating (l4x1)\n")
    assert "stack l4x1 is up: i-0abc" in result and "r/repo:tag" in result


def test_up_on_a_cluster_names_the_head_node_and_how_to_submit(stub_stack, monkeypatch):
    # l4x1's stack file with a cluster's outputs: only the message after Pulumi's up is tested.
    monkeypatch.setattr(SpoolDeployment, "up", lambda self, stack, pulumi_up, **_: pulumi_up())
    stub_stack.outputs_ = cluster_outputs(
        head_node="i-0head",
        submit_command="aws ssm start-session --target i-0head, then: sbatch ...",
        image_uri="r/repo:tag",
    )
    result = up.run(_args(), out=io.StringIO(), ask=lambda q: "y", probes=READY)
    assert "stack l4x1 is up: Slurm cluster, head node i-0head" in result
    assert "Submit: aws ssm start-session --target i-0head, then: sbatch" in result


def test_yes_flag_skips_the_question(stub_stack):
    stub_stack.outputs_ = stack_outputs(["i-0abc"], spot=False)
    up.run(_args(yes=True), out=io.StringIO(), ask=lambda q: pytest.fail("asked"), probes=READY)
    # The deployment reads the outputs first: the stack has its nodes, so this is an update.
    assert [c[0] for c in stub_stack.calls] == ["outputs", "up", "outputs"]


def test_without_a_terminal_up_wants_yes_in_one_line(stub_stack, capsys, monkeypatch):
    monkeypatch.setattr(up, "Probes", lambda: READY)
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    assert cli.main(["up", "l4x1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pass --yes" in err
    assert stub_stack.opened == []


def test_a_missing_pulumi_cli_is_one_line_with_the_install_command(monkeypatch, capsys):
    monkeypatch.setattr(workspace.shutil, "which", lambda name: None)
    assert cli.main(["up", "l4x1", "--yes"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "curl -fsSL https://get.pulumi.com | sh" in err


def test_a_bad_stack_file_stops_before_pulumi(tmp_path, monkeypatch, stub_stack):
    (tmp_path / "Pulumi.bad.yaml").write_text("config:\n  gpu:profile: l4x1\n  gpu:spot: maybe\n")
    monkeypatch.setattr(up, "stack_file_path", lambda name: tmp_path / f"Pulumi.{name}.yaml")
    with pytest.raises(ConfigError, match="gpu:spot is 'maybe'"):
        up.run(_args(stack="bad", yes=True), out=io.StringIO(), probes=READY)
    with pytest.raises(ConfigError, match=r"no stack file Pulumi\.none\.yaml"):
        up.run(_args(stack="none", yes=True), out=io.StringIO(), probes=READY)
    assert stub_stack.opened == []


def test_preview_runs_pulumi_preview_and_creates_nothing(stub_stack):
    stub_stack.resources = [{}] * 31
    result = up.run_preview(_args(), out=io.StringIO())
    assert [c[0] for c in stub_stack.calls] == ["preview"]
    assert result == "preview of l4x1: 31 to create"
    up.run_preview(_args(policy_pack=False), out=io.StringIO())
    assert [c[1]["policy_packs"] for c in stub_stack.calls] == [[str(REPO_ROOT / "policy")], []]


@pytest.mark.parametrize(
    ("probes", "expected"),
    [
        (
            Probes(pulumi_version=lambda: None),
            "error: the Pulumi CLI is not on PATH (up, preview and down run it): install it "
            "with `curl -fsSL https://get.pulumi.com | sh` (https://www.pulumi.com/docs/install/); "
            "nothing was created\n",
        ),
        (
            Probes(pulumi_version=READY.pulumi_version, aws_identity=_no_credentials),
            "error: no AWS credentials found: run `aws configure` (or `aws sso login`), or set "
            "AWS_PROFILE; nothing was created\n",
        ),
        (
            dataclasses.replace(READY, quota_vcpus=lambda region, need: 4.0),
            "error: 1 x g6.2xlarge needs 8 vCPUs of 'All G and VT Spot Instance Requests'; "
            "us-east-1 allows 4: request 8 vCPUs in the Service Quotas console (us-east-1, "
            "Amazon EC2, 'All G and VT Spot Instance Requests'); increases take "
            "hours to days; nothing was created\n",
        ),
    ],
    ids=["no-pulumi", "no-credentials", "no-quota"],
)
def test_up_checks_what_renting_needs_before_it_asks(
    stub_stack, monkeypatch, capsys, probes, expected
):
    monkeypatch.setattr(up, "Probes", lambda: probes)
    monkeypatch.setattr("builtins.input", lambda question: pytest.fail(f"asked: {question}"))
    assert cli.main(["up", "l4x1"]) == 2
    captured = capsys.readouterr()
    assert captured.err == expected
    assert "Create or update" not in captured.out and stub_stack.opened == []


def test_a_stack_name_pulumi_would_refuse_is_one_line(capsys):
    assert cli.main(["up", "../l4x1"]) == 2
    assert capsys.readouterr().err == (
        "error: stack name '../l4x1': a stack name is 1 to 100 letters, digits, '-', '_' or '.' "
        "(one of the profiles: l4x1, l40sx4, a100x8-80g, a100x8)\n"
    )


def test_preview_says_in_one_line_when_a_node_is_replaced(stub_stack, monkeypatch):
    def preview(**options):
        summary = {auto.OpType.REPLACE: 1, auto.OpType.UPDATE: 2, auto.OpType.SAME: 30}
        return auto.PreviewResult(stdout="", stderr="", change_summary=summary)

    monkeypatch.setattr(stub_stack, "preview", preview)
    assert up.run_preview(_args(), out=io.StringIO()) == (
        "preview of l4x1: 1 to replace, 2 to update; a replaced node is a new instance (its "
        "instance type, AMI, image or boot scripts changed), which loses its root volume's "
        "local checkpoints"
    )


def test_up_stores_hf_token_before_pulumi_creates_the_nodes(stub_stack, aws, monkeypatch):
    stub_stack.outputs_ = stack_outputs(["i-0abc"], spot=False, image_uri="r/repo:tag")
    monkeypatch.setenv("HF_TOKEN", "hf_upSecretValue")
    name = "gpu-stack/gpu-training-stack-l4x1/hf-token"  # <project>-<stack>
    secrets = aws.client("secretsmanager")
    seen = []
    stub_stack.on_up = lambda options: seen.append(
        secrets.get_secret_value(SecretId=name)["SecretString"]
    )
    out = io.StringIO()
    result = up.run(_args(), out=out, ask=lambda q: "y", probes=READY)
    assert seen == ["hf_upSecretValue"]  # there when Pulumi's up started
    said = out.getvalue()
    assert f"HF_TOKEN stored for the stack's jobs (Secrets Manager secret {name})" in said
    assert "hf_upSecretValue" not in said + result


def _first_up(stub_stack, aws, monkeypatch, *, docker: bool):
    """A new l4x1 stack: no outputs before its up; each Pulumi up answers with what the program
    would write, without nodes when `up` asks for that (infra/project.py, WITHOUT_NODES_ENV)."""
    repository = aws.client("ecr").create_repository(repositoryName="stack-repo")["repository"]
    image_uri = f"{repository['repositoryUri']}:{PLAN.image_tag}"
    asked = []

    def pulumi_up(options):
        asked.append("without nodes" if os.environ.get(WITHOUT_NODES_ENV) else "with nodes")
        nodes = [] if os.environ.get(WITHOUT_NODES_ENV) else ["i-0abc"]
        stub_stack.outputs_ = stack_outputs(nodes, spot=True, image_uri=image_uri)

    stub_stack.on_up = pulumi_up
    monkeypatch.setattr(stack_image, "can_build", lambda: docker)
    return image_uri, asked


def _push(aws, image_uri: str) -> None:
    """The image as `images build --push` leaves it: a manifest under the variant's tag."""
    tag = image_uri.rsplit(":", 1)[1]
    manifest = json.dumps({"schemaVersion": 2, "mediaType": "application/json", "layers": []})
    aws.client("ecr").put_image(repositoryName="stack-repo", imageManifest=manifest, imageTag=tag)


def test_a_new_stack_without_docker_stops_before_its_nodes_until_the_image_is_pushed(
    stub_stack, aws, monkeypatch
):
    image_uri, asked = _first_up(stub_stack, aws, monkeypatch, docker=False)
    out = io.StringIO()
    said = up.run(_args(yes=True), out=out, probes=READY)
    assert asked == ["without nodes"]
    assert "no docker here `up` stops after the repository" in out.getvalue()
    assert said.splitlines() == [
        f"stack l4x1 is ready for its image, and rents no GPU yet: push {image_uri} (README, "
        "Running on AWS: `python -m images build`), then",
        "`python -m infra up l4x1` again creates the nodes",
    ]
    # Pushed: the next `up` finds it and creates the nodes.
    _push(aws, image_uri)
    said = up.run(_args(yes=True), out=out, probes=READY)
    assert asked == ["without nodes", "without nodes", "with nodes"]
    assert said.startswith("stack l4x1 is up: i-0abc")


def test_a_new_stack_with_docker_pushes_its_image_before_it_creates_the_nodes(
    stub_stack, aws, monkeypatch
):
    image_uri, asked = _first_up(stub_stack, aws, monkeypatch, docker=True)
    built = []

    def build_and_push(ecr, image, variant, *, say):
        built.append((str(image), variant, list(asked)))
        _push(aws, str(image))

    monkeypatch.setattr(stack_image, "build_and_push", build_and_push)
    said = up.run(_args(yes=True), out=io.StringIO(), probes=READY)
    # Built and pushed once the repository exists, before any node.
    assert built == [(image_uri, PLAN.variant.name, ["without nodes"])]
    assert asked == ["without nodes", "with nodes"]
    assert said.startswith("stack l4x1 is up: i-0abc")


def test_the_image_reference_is_read_as_ecr_names_it():
    image = ImageRef.parse(
        "123456789012.dkr.ecr.us-east-1.amazonaws.com/team/stack:0.1-cu130@sha256:ab"
    )
    assert (image.registry, image.repository, image.tag, image.digest) == (
        "123456789012.dkr.ecr.us-east-1.amazonaws.com",
        "team/stack",
        "0.1-cu130",
        "sha256:ab",
    )
    assert (
        str(image) == "123456789012.dkr.ecr.us-east-1.amazonaws.com/team/stack:0.1-cu130@sha256:ab"
    )
