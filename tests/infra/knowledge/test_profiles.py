"""The profiles resolve to the intended instances, with prices beside the selection guide's."""

import datetime
from pathlib import Path

import pytest

from infra.config.stack_file import REPO_ROOT, stack_file_config, stack_file_path
from infra.errors import ConfigError
from infra.knowledge.profiles import (
    PROFILES_PATH,
    guide_price_warning,
    load_profiles,
    resolve_profile,
)
from infra.knowledge.resolver import resolve

TODAY = datetime.date(2026, 11, 30)
PROFILES_TEXT = PROFILES_PATH.read_text()


def modified_profiles(tmp_path: Path, old: str, new: str) -> Path:
    assert old in PROFILES_TEXT, f"test fixture out of date: {old!r} not in profiles.toml"
    path = tmp_path / "profiles.toml"
    path.write_text(PROFILES_TEXT.replace(old, new, 1))
    return path


@pytest.mark.parametrize(
    ("name", "instance_type", "gpus", "gpu_model", "guide"),
    [
        ("l4x1", "g6.2xlarge", 1, "L4", (8, 12)),
        ("l40sx4", "g6e.12xlarge", 4, "L40S", (25, 35)),
        ("a100x8-80g", "p4de.24xlarge", 8, "A100", (180, 220)),
        ("a100x8", "p4d.24xlarge", 8, "A100", None),
    ],
)
def test_profiles_resolve_to_their_instances(name, instance_type, gpus, gpu_model, guide):
    profiles = load_profiles()
    plan = resolve_profile(name, today=TODAY)
    assert (plan.instance.type, plan.gpus, plan.instance.gpu_model) == (
        instance_type,
        gpus,
        gpu_model,
    )
    assert profiles.get(name).guide_cny_per_hour == guide
    assert profiles.get(name).mapping  # every profile says why it maps where it does


def test_default_profile_is_a100x8():
    assert load_profiles().default == "a100x8"
    assert resolve_profile(today=TODAY).instance.type == "p4d.24xlarge"


def test_a100x8_80g_is_eight_80gb_a100s_on_nvswitch():
    plan = resolve_profile("a100x8-80g", today=TODAY)
    assert plan.instance.gpu_memory_gib == 80 and plan.instance.gpu_interconnect == "NVSwitch"


def test_l40sx4_explains_that_aws_sells_no_two_a100_instance():
    mapping = load_profiles().get("l40sx4").mapping
    assert "no 2x A100" in mapping and "g5.12xlarge" in mapping and "Trade-off" in mapping
    plan = resolve_profile("l40sx4", today=TODAY)
    # Each L40S holds at least what one A100 40GB holds.
    assert plan.instance.gpu_memory_gib >= 40


def test_l4x1_answers_the_v100_row_and_says_aws_no_longer_sells_a_bootable_v100():
    profile = load_profiles().get("l4x1")
    assert profile.guide_row == "small image classification on 1x V100 16GB"
    assert "past end of life" in profile.guide_hardware_gone
    plan = resolve_profile("l4x1", today=TODAY)
    assert not any("past end of life" in warning for warning in plan.warnings)
    # 0.9776 USD/h x 7.10 = 6.9 CNY/h, under the guide's 8-12.
    gap = [warning for warning in plan.warnings if "selection guide's 8-12 CNY/h" in warning]
    assert len(gap) == 1 and "7 CNY/h is below" in gap[0]
    # The V100 itself stays plannable, with its warning.
    v100 = resolve("p3.2xlarge", today=TODAY)
    assert any("past end of life" in warning for warning in v100.warnings)


def test_each_profile_is_named_for_the_gpus_it_rents():
    """A name is MODELxCOUNT[-MEMORY]: the instance's GPU model and count."""
    for name in load_profiles().profiles:
        plan = resolve_profile(name, today=TODAY)
        model, count = name.split("-")[0].split("x")
        assert model == plan.instance.gpu_model.lower(), name
        assert int(count) == plan.gpus, name


def test_every_shipped_stack_file_is_named_for_its_profile():
    stacks = {path.name.split(".")[1] for path in REPO_ROOT.glob("Pulumi.*.yaml")}
    assert stacks == set(load_profiles().profiles)
    for stack in stacks:
        assert stack_file_config(stack_file_path(stack))["gpu:profile"] == stack


def test_price_inside_the_guide_range_adds_no_warning():
    profiles = load_profiles()
    profile = profiles.get("l4x1")
    plan = resolve_profile("l4x1", today=TODAY)
    rate = profiles.exchange_rate
    assert rate.to_cny(plan.on_demand_usd_per_hour) == pytest.approx(0.9776 * rate.cny_per_usd)
    cheap = type(plan)(**{**plan.__dict__, "on_demand_usd_per_hour": 10 / rate.cny_per_usd})
    assert guide_price_warning(profile, cheap, rate) is None
    dear = type(plan)(**{**plan.__dict__, "on_demand_usd_per_hour": 5 / rate.cny_per_usd})
    assert "below the selection guide's 8-12 CNY/h" in guide_price_warning(profile, dear, rate)


def test_exchange_rate_has_date_and_source():
    rate = load_profiles().exchange_rate
    assert rate.cny_per_usd > 0 and rate.as_of.year >= 2025 and rate.source


def test_unknown_profile_names_the_known_ones():
    with pytest.raises(ConfigError, match="unknown profile 'a100x4': known profiles are l4x1"):
        resolve_profile("a100x4", today=TODAY)


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        (
            'instance_type = "g6.2xlarge"',
            'instance_typ = "g6.2xlarge"',
            ["profile 'l4x1'", "field 'instance_typ'", "unknown key"],
        ),
        (
            "guide_cny_per_hour = [8, 12]",
            "guide_cny_per_hour = [12, 8]",
            ["profile 'l4x1'", "field 'guide_cny_per_hour'", "low <= high"],
        ),
        ('default = "a100x8"', 'default = "a100x16"', ["'default'", "a100x16", "l4x1"]),
        ("cny_per_usd = 7.10", "cny_per_usd = -7.10", ["exchange_rate", "field 'cny_per_usd'"]),
        ("nodes = 1", "nodes = 0", ["profile 'l4x1'", "field 'nodes'"]),
    ],
)
def test_bad_profiles_file(tmp_path, old, new, expected):
    with pytest.raises(ConfigError) as caught:
        load_profiles(modified_profiles(tmp_path, old, new))
    message = str(caught.value)
    assert "\n" not in message
    for part in expected:
        assert part in message


def test_profile_with_an_impossible_variant_fails_at_resolve(tmp_path):
    path = modified_profiles(
        tmp_path,
        'instance_type = "g6.2xlarge"\nvariant = "auto"',
        'instance_type = "p3.2xlarge"\nvariant = "cu130"',
    )
    with pytest.raises(ConfigError, match="CUDA 13 dropped"):
        resolve_profile("l4x1", profiles=load_profiles(path), today=TODAY)
