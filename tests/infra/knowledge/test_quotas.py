"""The quota table (data/quotas.toml) is checked like every other data file."""

from __future__ import annotations

import pytest

from infra.errors import ConfigError
from infra.knowledge.quotas import QUOTAS_PATH, quota_need
from infra.knowledge.resolver import resolve


def test_a_quota_with_an_unknown_market_is_one_line_naming_the_entry(tmp_path):
    path = tmp_path / "quotas.toml"
    text = QUOTAS_PATH.read_text()
    path.write_text(text.replace('market = "on-demand"', 'market = "ondemand"', 1))
    with pytest.raises(ConfigError) as caught:
        quota_need(resolve("p4d.24xlarge"), "on-demand", path)
    assert str(caught.value) == (
        "quotas.toml: quota 'p-on-demand', field 'market' is 'ondemand': "
        "input should be 'on-demand' or 'spot'"
    )


def test_a_quota_without_names_is_refused(tmp_path):
    path = tmp_path / "quotas.toml"
    text = QUOTAS_PATH.read_text()
    path.write_text(text.replace('names = ["Running On-Demand P instances"]', "names = []", 1))
    with pytest.raises(ConfigError, match=r"^quotas\.toml: quota 'p-on-demand', field 'names'"):
        quota_need(resolve("p4d.24xlarge"), "on-demand", path)
