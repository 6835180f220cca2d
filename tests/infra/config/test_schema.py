"""Stack config: every bad key or value stops the program before any resource exists."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pulumi
import pytest

from infra.config.guardrails import GuardrailConfig
from infra.config.schema import load_stack_config, own_keys
from infra.dryrun.mocks import RecordingMocks
from infra.errors import ConfigError
from infra.knowledge import parallelcluster
from tests.support.infra import parallelcluster_without_head_node_price
from tests.support.stack_runs import BASE_CONFIG, run_stack

BAD_VALUES = [
    # (config, words the message must contain: the key, the value, what would work)
    ({"nodez": "2"}, ["gpu:nodez", "'2'", "gpu:nodes", "gpu:budgetUsd"]),
    ({"nodes": "0"}, ["gpu:nodes", "'0'", "at least 1"]),
    ({"nodes": "two"}, ["gpu:nodes", "'two'", "whole number"]),
    ({"spot": "yes"}, ["gpu:spot", "'yes'", "true or false"]),
    ({"useDefaultVpc": "1"}, ["gpu:useDefaultVpc", "'1'", "true or false"]),
    ({"sshCidr": "0.0.0.0/0"}, ["gpu:sshCidr", "'0.0.0.0/0'", "203.0.113.7/32", "Session Manager"]),
    ({"sshCidr": "10.0.0.1/33"}, ["gpu:sshCidr", "'10.0.0.1/33'", "IPv4 CIDR"]),
    ({"dataS3Uri": "https://bucket/data"}, ["gpu:dataS3Uri", "'https://bucket/data'", "s3://"]),
    ({"profile": "a100x16"}, ["gpu:profile", "'a100x16'", "a100x8", "l4x1"]),
    ({"instanceType": "p9.huge"}, ["gpu:instanceType", "'p9.huge'", "p4d.24xlarge"]),
    ({"imageVariant": "cu999"}, ["gpu:imageVariant", "'cu999'", "cu130"]),
    (
        {"instanceType": "p3.2xlarge", "imageVariant": "cu130"},
        ["gpu:imageVariant", "'cu130'", "V100", "cu128"],
    ),
    ({"logRetentionDays": "31"}, ["gpu:logRetentionDays", "'31'", "30", "365"]),
    ({"rootVolumeGiB": "20"}, ["gpu:rootVolumeGiB", "'20'", "at least 100"]),
    ({"availabilityZone": "mars"}, ["gpu:availabilityZone", "'mars'", "us-east-1a"]),
    ({"imageTag": "latest tag"}, ["gpu:imageTag", "'latest tag'", "letters, digits"]),
    ({"imageDigest": "sha256:abc"}, ["gpu:imageDigest", "'sha256:abc'", "64 lower-case hex"]),
    ({"trainConfig": "no/such/train.toml"}, ["gpu:trainConfig", "'no/such/train.toml'", "TOML"]),
    ({"budgetUsd": "-5"}, ["gpu:budgetUsd", "-5", "positive amount"]),
    ({"alertEmails": "[]"}, ["gpu:alertEmails", "empty", "gpu:allowNoAlerts"]),
    ({"budgetUsd": "20"}, ["gpu:budgetUsd", "20", "one hour", "at least 22"]),
    ({"cluster": "kubernetes"}, ["gpu:cluster", "'kubernetes'", "'slurm'"]),
    ({"parallelClusterVersion": "3.15.1"}, ["gpu:parallelClusterVersion", "gpu:cluster: slurm"]),
    (
        {"cluster": "slurm", "parallelClusterVersion": "3.9.0"},
        ["gpu:parallelClusterVersion", "'3.9.0'", "3.14.0", "3.15.1"],
    ),
]


@pytest.mark.parametrize(
    ("config", "words"), BAD_VALUES, ids=[next(iter(c)) + "=" + str(c) for c, _ in BAD_VALUES]
)
def test_bad_value_fails_before_any_resource_with_a_sentence_naming_it(config, words):
    mocks = RecordingMocks()
    with pytest.raises(pulumi.RunError) as raised:
        run_stack(mocks=mocks, **config)
    message = str(raised.value)
    for word in words:
        assert word in message, message
    assert "\n" not in message
    assert mocks.resources == []


def test_defaults_give_a_safe_on_demand_stack():
    config = load_stack_config(BASE_CONFIG)
    assert config.profile == "a100x8"
    assert config.spot is False
    assert config.ssh_cidr is None
    assert config.use_default_vpc is False
    assert config.log_retention_days == 30
    assert config.root_volume_gib == 500
    assert config.guardrails.alert_emails == ("ml-team@example.com",)


def test_values_arrive_as_pulumi_strings_and_parse_strictly():
    config = load_stack_config(
        {
            "nodes": "2",
            "cluster": "slurm",
            "spot": "True",
            "sshCidr": "203.0.113.7/32",
            "dataS3Uri": "s3://my-data/corpus/v2/",
            "logRetentionDays": "14",
            **BASE_CONFIG,
        }
    )
    assert config.nodes == 2 and config.spot is True
    assert config.ssh_cidr == ipaddress.IPv4Network("203.0.113.7/32")
    assert (config.data_s3_uri.bucket, config.data_s3_uri.prefix) == ("my-data", "corpus/v2")
    assert str(config.data_s3_uri) == "s3://my-data/corpus/v2"
    assert config.log_retention_days == 14


@pytest.mark.parametrize("nodes", ["2", "64"])
def test_more_than_one_node_needs_the_slurm_cluster(nodes):
    with pytest.raises(ConfigError) as raised:
        load_stack_config({**BASE_CONFIG, "nodes": nodes})
    message = str(raised.value)
    assert "\n" not in message
    assert f"gpu:nodes is {nodes}" in message and "set gpu:cluster: slurm" in message
    assert load_stack_config({**BASE_CONFIG, "nodes": nodes, "cluster": "slurm"}).nodes == int(
        nodes
    )


def test_a_cluster_in_a_region_without_a_head_node_price_fails_preview_creating_nothing(
    tmp_path, monkeypatch
):
    # A region with instance prices (prices.toml) but, in this copy, no head-node price.
    path = parallelcluster_without_head_node_price(tmp_path, "eu-west-1")
    monkeypatch.setattr(parallelcluster, "PARALLELCLUSTER_PATH", path)
    mocks = RecordingMocks()
    with pytest.raises(pulumi.RunError) as raised:
        run_stack(mocks, cluster="slurm", nodes=2, **{"aws:region": "eu-west-1"})
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith("aws:region is 'eu-west-1': the catalog has no head-node price")
    assert "infra/knowledge/data/parallelcluster.toml" in message
    assert mocks.resources == []


def test_every_key_is_documented():
    doc = (Path(__file__).resolve().parents[3] / "docs" / "stack.md").read_text()
    for key in (*own_keys(), *GuardrailConfig.config_keys()):
        assert f"`gpu:{key}`" in doc, key
