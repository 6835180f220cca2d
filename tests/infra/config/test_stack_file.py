"""Stack files read as the Pulumi CLI hands their config to the program, checked the same way."""

from __future__ import annotations

import pytest

from infra.config.stack_file import REPO_ROOT, load_stack_file, stack_file_path, stack_file_region
from infra.errors import ConfigError
from infra.planning import resolve_plan


def test_stack_files_sit_next_to_pulumi_yaml():
    assert stack_file_path("a100x8") == REPO_ROOT / "Pulumi.a100x8.yaml"
    assert (REPO_ROOT / "Pulumi.yaml").is_file()


def test_yaml_values_reach_the_config_as_pulumi_passes_them(tmp_path):
    path = tmp_path / "Pulumi.mine.yaml"
    path.write_text(
        "config:\n  aws:region: eu-west-1\n  gpu:profile: l4x1\n  gpu:spot: true\n"
        "  gpu:budgetUsd: 250\n  gpu:alertEmails:\n    - a@example.com\n    - b@example.com\n"
    )
    stack = load_stack_file(path)
    assert (stack.profile, stack.spot) == ("l4x1", True)
    assert stack.guardrails.budget_usd == 250
    assert stack.guardrails.alert_emails == ("a@example.com", "b@example.com")


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ("gpu:spot: maybe", "Pulumi.bad.yaml: gpu:spot is 'maybe'"),
        ("gpu:budgtUsd: 5", "Pulumi.bad.yaml: gpu:budgtUsd is not a config key"),
        ("- not a map", "'config' must be a mapping"),
    ],
)
def test_bad_stack_file_is_one_line_naming_the_file(tmp_path, config, expected):
    path = tmp_path / "Pulumi.bad.yaml"
    path.write_text(f"config:\n  {config}\n")
    with pytest.raises(ConfigError) as caught:
        load_stack_file(path)
    assert expected in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize("word", ["yes", "no", "on", "off", "y", "n", "Yes", "ON"])
def test_yaml_1_1_booleans_are_refused_as_the_pulumi_cli_passes_them(tmp_path, word):
    """The Pulumi CLI reads YAML 1.2, where these are strings; the schema refuses them."""
    path = tmp_path / "Pulumi.bad.yaml"
    path.write_text(f"config:\n  gpu:profile: l4x1\n  gpu:spot: {word}\n")
    with pytest.raises(ConfigError, match=f"gpu:spot is '{word}'"):
        load_stack_file(path)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "config:\n  aws:regoin: eu-west-1\n  aws:region: us-east-1\n",
            "Pulumi.bad.yaml: aws:regoin is not a setting of the AWS provider: did you mean "
            "aws:region? (its settings: "
            "https://www.pulumi.com/registry/packages/aws/installation-configuration/)",
        ),
        (
            "config:\n  gpu:profile: l4x1\n  gpu:spot: false\n  gpu:spot: true\n",
            "Pulumi.bad.yaml: gpu:spot is given twice (lines 3 and 4): keep one of them",
        ),
        (
            "config:\n  gpus:budgetUsd: 500\n",
            "Pulumi.bad.yaml: gpus:budgetUsd is in no namespace anything here reads: did you "
            "mean gpu:budgetUsd? (this program reads gpu: keys, the AWS provider aws: keys)",
        ),
        (
            "config:\n  budgetUsd: 500\n",
            "Pulumi.bad.yaml: budgetUsd is in no namespace anything here reads: did you "
            "mean gpu:budgetUsd? (this program reads gpu: keys, the AWS provider aws: keys)",
        ),
        (
            "confg:\n  gpu:budgetUsd: 500\n",
            "Pulumi.bad.yaml: top-level key 'confg' is not one Pulumi reads (did you mean config?)",
        ),
        (
            "config:\n  gpu:budgetUsd: 1e12\n",
            "Pulumi.bad.yaml: gpu:budgetUsd is '1e12': must be at most 1e+06; use a positive "
            "amount of US dollars per budget period, at most 1,000,000, e.g. 200",
        ),
        (
            "config:\n  gpu:nodes: 100000\n  gpu:cluster: slurm\n",
            "Pulumi.bad.yaml: gpu:nodes is '100000': must be at most 256",
        ),
    ],
    ids=["aws-typo", "twice", "namespace-typo", "no-namespace", "block-typo", "budget", "nodes"],
)
def test_a_key_nothing_would_read_or_a_number_out_of_range_is_refused(tmp_path, text, expected):
    path = tmp_path / "Pulumi.bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_stack_file(path)
    assert str(caught.value).startswith(expected), str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_folder_given_as_the_stack_file_is_named(tmp_path):
    with pytest.raises(ConfigError) as caught:
        load_stack_file(tmp_path)
    assert str(caught.value) == f"{tmp_path} is a folder: give the stack file, Pulumi.<stack>.yaml"


@pytest.mark.parametrize("path", sorted(REPO_ROOT.glob("Pulumi.*.yaml")), ids=lambda p: p.name)
def test_every_example_stack_stops_a_runaway_node_within_its_budget(path):
    """A hung job keeps its GPUs busy, so only the runtime alarm stops it before the budget:
    each example sets gpu:maxRuntimeHours, and one run that long fits in the budget."""
    stack = load_stack_file(path)
    hours = stack.guardrails.max_runtime_hours
    assert hours is not None, f"{path.name} sets no gpu:maxRuntimeHours"
    plan = resolve_plan(stack, stack_file_region(path))
    hourly = plan.spot_usd_per_hour if stack.spot else plan.on_demand_usd_per_hour
    assert hours * hourly <= stack.guardrails.budget_usd
