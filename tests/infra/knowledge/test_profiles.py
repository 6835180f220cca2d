"""The profiles resolve to the intended instances, with prices beside the selection guide's."""

import datetime
from pathlib import Path

import pytest

from infra.errors import ConfigError
from infra.knowledge.profiles import (
    PROFILES_PATH,
    guide_price_warning,
    load_profiles,
    resolve_profile,
)

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
        ("v100x1", "p3.2xlarge", 1, "V100", (8, 12)),
        ("a100x2", "g6e.12xlarge", 4, "L40S", (25, 35)),
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


def test_a100x2_explains_that_aws_sells_no_two_a100_instance():
    mapping = load_profiles().get("a100x2").mapping
    assert "no 2x A100" in mapping and "g5.12xlarge" in mapping and "Trade-off" in mapping
    plan = resolve_profile("a100x2", today=TODAY)
    # Each L40S holds at least what one A100 40GB holds.
    assert plan.instance.gpu_memory_gib >= 40


def test_v100_profile_carries_the_end_of_life_warning_and_the_price_gap():
    plan = resolve_profile("v100x1", today=TODAY)
    assert any("past end of life" in warning for warning in plan.warnings)
    # 3.06 USD/h x 7.10 = 21.7 CNY/h, above the guide's 8-12.
    gap = [warning for warning in plan.warnings if "selection guide's 8-12 CNY/h" in warning]
    assert len(gap) == 1 and "22 CNY/h is above" in gap[0]


def test_price_inside_the_guide_range_adds_no_warning():
    profiles = load_profiles()
    profile = profiles.get("v100x1")
    plan = resolve_profile("v100x1", today=TODAY)
    rate = profiles.exchange_rate
    assert rate.to_cny(plan.on_demand_usd_per_hour) == pytest.approx(3.06 * rate.cny_per_usd)
    cheap = type(plan)(**{**plan.__dict__, "on_demand_usd_per_hour": 10 / rate.cny_per_usd})
    assert guide_price_warning(profile, cheap, rate) is None
    dear = type(plan)(**{**plan.__dict__, "on_demand_usd_per_hour": 5 / rate.cny_per_usd})
    assert "below the selection guide's 8-12 CNY/h" in guide_price_warning(profile, dear, rate)


def test_exchange_rate_has_date_and_source():
    rate = load_profiles().exchange_rate
    assert rate.cny_per_usd > 0 and rate.as_of.year >= 2025 and rate.source


def test_unknown_profile_names_the_known_ones():
    with pytest.raises(ConfigError, match="unknown profile 'a100x4': known profiles are v100x1"):
        resolve_profile("a100x4", today=TODAY)


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        (
            'instance_type = "p3.2xlarge"',
            'instance_typ = "p3.2xlarge"',
            ["profile 'v100x1'", "field 'instance_typ'", "unknown key"],
        ),
        (
            "guide_cny_per_hour = [8, 12]",
            "guide_cny_per_hour = [12, 8]",
            ["profile 'v100x1'", "field 'guide_cny_per_hour'", "low <= high"],
        ),
        ('default = "a100x8"', 'default = "a100x16"', ["'default'", "a100x16", "v100x1"]),
        ("cny_per_usd = 7.10", "cny_per_usd = -7.10", ["exchange_rate", "field 'cny_per_usd'"]),
        ("nodes = 1", "nodes = 0", ["profile 'v100x1'", "field 'nodes'"]),
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
        'instance_type = "p3.2xlarge"\nvariant = "auto"',
        'instance_type = "p3.2xlarge"\nvariant = "cu130"',
    )
    with pytest.raises(ConfigError, match="CUDA 13 dropped"):
        resolve_profile("v100x1", profiles=load_profiles(path), today=TODAY)
