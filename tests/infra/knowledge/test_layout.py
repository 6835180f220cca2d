"""Node layout rules: the zone a stack uses."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from infra.errors import ConfigError
from infra.knowledge.layout import choose_zone


def test_zone_is_the_first_by_name_that_offers_the_type():
    assert choose_zone("p4d.24xlarge", None, ["us-east-1d", "us-east-1b"]) == "us-east-1b"


def test_configured_zone_is_kept_when_offered():
    assert choose_zone("p4d.24xlarge", "us-east-1d", ["us-east-1b", "us-east-1d"]) == "us-east-1d"


def test_configured_zone_without_the_type_names_the_zones_that_have_it():
    with pytest.raises(ConfigError, match="use one of us-east-1b, us-east-1c or leave it unset"):
        choose_zone("p4d.24xlarge", "us-east-1a", ["us-east-1c", "us-east-1b"])


def test_no_zone_offering_the_type_names_the_region_and_type_keys():
    with pytest.raises(ConfigError, match=r"aws:region.*gpu:instanceType"):
        choose_zone("p5.48xlarge", None, [])


# --- properties, over generated offerings and zone names -----------------------------------

_ZONES = st.sampled_from([f"us-east-1{letter}" for letter in "abcdef"])


@given(offered=st.lists(_ZONES, min_size=1, max_size=6))
def test_an_unset_zone_is_the_smallest_name_offered_whatever_the_order(offered):
    chosen = choose_zone("p4d.24xlarge", None, offered)
    assert chosen in offered
    assert all(chosen <= zone for zone in offered)
    assert choose_zone("p4d.24xlarge", None, list(reversed(offered))) == chosen


@given(offered=st.lists(_ZONES, min_size=1, max_size=6), requested=_ZONES)
def test_a_set_zone_is_kept_exactly_when_offered(offered, requested):
    if requested in offered:
        assert choose_zone("p4d.24xlarge", requested, offered) == requested
    else:
        with pytest.raises(ConfigError, match=re.escape(repr(requested))):
            choose_zone("p4d.24xlarge", requested, offered)
