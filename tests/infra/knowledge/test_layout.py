"""Node layout rules: EFA interfaces per AWS's multi-card guide, the zone a stack uses."""

from __future__ import annotations

import pytest

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
