"""`python -m infra prices`: a region's prices shown from the catalog; the refresh refuses to
start without AWS credentials (the refresh itself: tests/infra/knowledge/test_price_refresh.py)."""

from __future__ import annotations

import argparse
import shutil

import pytest

from infra.commands.prices import run
from infra.errors import ConfigError
from infra.knowledge.catalog import CATALOG_DIR, load_catalog
from tests.support.infra import run_cli


@pytest.fixture
def catalog_copy(tmp_path):
    for name in ("instances.toml", "amis.toml", "prices.toml", "volume_and_address_prices.toml"):
        shutil.copy(CATALOG_DIR / name, tmp_path / name)
    return tmp_path


def test_refresh_without_credentials_changes_nothing(catalog_copy, monkeypatch, tmp_path):
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    before = (catalog_copy / "prices.toml").read_text()
    args = argparse.Namespace(refresh=True, region=None, catalog=catalog_copy)
    with pytest.raises(ConfigError, match="needs AWS credentials"):
        run(args)
    assert (catalog_copy / "prices.toml").read_text() == before


def test_the_prices_command_shows_a_region_and_refuses_an_unpriced_one():
    p4d = load_catalog().prices.price("eu-west-1", "p4d.24xlarge")
    shown = run_cli("prices", "--region", "eu-west-1")
    assert shown.returncode == 0, shown.stderr
    assert f"on-demand ${p4d.on_demand_usd_per_hour:>8.3f}/h" in shown.stdout
    # EU (Ireland): gp3 $0.088 a GB-month, a public IPv4 address $0.005/h
    # (volume_and_address_prices.toml).
    assert "EBS per GB-month: gp3 $0.088, gp2 $0.11," in shown.stdout
    assert "public IPv4 $0.005/h" in shown.stdout
    virginia = run_cli("prices", "--region", "us-east-1")
    # p4d.24xlarge in us-east-1: a Capacity Block at $11.80/h (the pricing page, 2026-07-22).
    row = next(line for line in virginia.stdout.splitlines() if "p4d.24xlarge" in line)
    assert "block $ 11.800/h" in row
    missing = run_cli("prices", "--region", "eu-west-3")
    assert missing.returncode == 2 and "eu-west-1, us-east-1, us-west-2" in missing.stderr
