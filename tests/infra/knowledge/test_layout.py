"""Node layout rules: EFA interfaces per AWS's multi-card guide, the zone a stack uses."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from infra.errors import ConfigError
from infra.knowledge.catalog import load_catalog
from infra.knowledge.layout import choose_zone, interface_layout
from infra.knowledge.resolver import resolve


def kinds(plan) -> list[tuple[int, int, str | None]]:
    return [
        (i.network_card_index, i.device_index, i.interface_type) for i in interface_layout(plan)
    ]


def test_single_node_gets_one_plain_interface_even_on_an_efa_type():
    assert kinds(resolve("p4d.24xlarge", nodes=1)) == [(0, 0, None)]


def test_p4d_multi_node_gets_four_efa_interfaces_one_per_card():
    assert kinds(resolve("p4d.24xlarge", nodes=2)) == [
        (0, 0, "efa"),
        (1, 1, "efa"),
        (2, 1, "efa"),
        (3, 1, "efa"),
    ]


def test_p5_multi_node_gets_32_cards_with_efa_only_secondaries():
    layout = kinds(resolve("p5.48xlarge", nodes=2))
    assert len(layout) == 32
    # The primary interface cannot be EFA-only: it carries the node's IP traffic.
    assert layout[0] == (0, 0, "efa")
    assert layout[1:] == [(card, 1, "efa-only") for card in range(1, 32)]


def test_multi_node_without_efa_keeps_one_plain_interface():
    assert kinds(resolve("p3.2xlarge", nodes=2)) == [(0, 0, None)]


def test_only_families_documented_efa_only_get_efa_only_secondaries():
    for instance in load_catalog().instances.values():
        if instance.efa_interfaces < 2:
            continue
        layout = kinds(resolve(instance.type, nodes=2))
        expected = "efa-only" if instance.type.startswith("p5") else "efa"
        assert {kind for _, _, kind in layout[1:]} == {expected}, instance.type


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


_EFA_TYPES = sorted(
    instance.type for instance in load_catalog().instances.values() if instance.efa_interfaces
)


@given(instance_type=st.sampled_from(_EFA_TYPES), nodes=st.integers(min_value=1, max_value=64))
def test_every_layout_has_one_primary_and_one_interface_per_card(instance_type, nodes):
    plan = resolve(instance_type, nodes=nodes)
    layout = interface_layout(plan)
    cards = [interface.network_card_index for interface in layout]
    assert len(set(cards)) == len(cards)  # never two interfaces on one card
    assert (layout[0].network_card_index, layout[0].device_index) == (0, 0)
    if nodes == 1:
        assert layout == [layout[0]] and layout[0].interface_type is None
    else:
        assert len(layout) == plan.instance.efa_interfaces
        assert layout[0].interface_type == "efa"  # the primary carries IP traffic too
        assert all(interface.device_index == 1 for interface in layout[1:])
