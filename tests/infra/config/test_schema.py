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


def test_bad_toml_in_train_config_names_the_key(tmp_path):
    broken = tmp_path / "train.toml"
    broken.write_text("[optimizer\nlr = 1e-4\n")
    mocks = RecordingMocks()
    with pytest.raises(pulumi.RunError, match=r"gpu:trainConfig is .*: not valid TOML"):
        run_stack(mocks=mocks, trainConfig=str(broken))
    assert mocks.resources == []


def test_a_train_config_larger_than_user_data_may_be_is_fine(tmp_path):
    # It travels as the job spool's first job in S3, not in the user data (infra/jobs/spool.py).
    big = tmp_path / "train.toml"
    big.write_text("".join(f"key{i} = {i}\n" for i in range(2000)))
    assert len(big.read_bytes()) > 16 * 1024
    config = load_stack_config({**BASE_CONFIG, "trainConfig": str(big)})
    assert config.train_config_text == big.read_text()


# A job the trainer accepts on one a100x8 node or two on the cluster (8 or 16 GPUs, compute
# capability 8.0).
BF16_JOB = "[precision]\nbf16 = true\n[train]\nglobal_batch_size = 64\nmicro_batch_size = 4\n"


def check_job(tmp_path: Path, toml: str, **config: str) -> None:
    """The stack's plan-time checks with `toml` as gpu:trainConfig."""
    job = tmp_path / "job.toml"
    job.write_text(toml)
    stack = load_stack_config({**BASE_CONFIG, **config, "trainConfig": str(job)})
    stack.check_plan(stack.resolve_plan("us-east-1"))


@pytest.mark.parametrize("nodes", [{"nodes": "1"}, {"nodes": "2", "cluster": "slurm"}])
def test_a_job_the_trainer_accepts_passes(tmp_path, nodes):
    check_job(tmp_path, BF16_JOB, profile="a100x8", **nodes)


def test_bf16_on_a_v100_fails_before_any_resource_with_the_trainers_message(tmp_path):
    job = tmp_path / "job.toml"
    job.write_text(BF16_JOB)
    mocks = RecordingMocks()
    with pytest.raises(pulumi.RunError) as raised:
        run_stack(mocks=mocks, instanceType="p3.2xlarge", trainConfig=str(job))
    message = str(raised.value)
    assert message.startswith(f"gpu:trainConfig is {str(job)!r}: the trainer would refuse it on ")
    for words in ("1 x p3.2xlarge", "compute capability 7.0", "precision.bf16 = true"):
        assert words in message, message
    assert message.endswith("use precision.fp16 = true")
    assert "\n" not in message
    assert mocks.resources == []


def test_global_batch_size_must_divide_by_every_gpu_of_every_node(tmp_path):
    job = "[train]\nglobal_batch_size = 24\n"
    check_job(tmp_path, job, profile="a100x8")  # 24 = 3 x 8 GPUs
    with pytest.raises(ConfigError) as raised:
        check_job(tmp_path, job, profile="a100x8", nodes="2", cluster="slurm")
    message = str(raised.value)
    assert "gpu:trainConfig" in message and "2 x p4d.24xlarge (world size 16" in message
    assert "train.global_batch_size = 24 is not divisible by world size = 16" in message


def test_unknown_training_key_fails(tmp_path):
    with pytest.raises(ConfigError, match=r"gpu:trainConfig is .*: train\.stepz: unknown key"):
        check_job(tmp_path, "[train]\nstepz = 10\n")


def test_builder_import_string_is_checked_for_its_form_only(tmp_path):
    # Not importable here (the package would be in the image): the node checks that.
    check_job(tmp_path, '[model]\nbuilder = "mypkg.models:build"\n')
    with pytest.raises(
        ConfigError, match=r"gpu:trainConfig .*model\.builder is 'mypkg\.models\.build'"
    ):
        check_job(tmp_path, '[model]\nbuilder = "mypkg.models.build"\n')


def test_data_path_may_come_from_the_stacks_data_uri(tmp_path):
    job = '[data]\nkind = "tokens"\n'
    with pytest.raises(
        ConfigError, match=r"gpu:trainConfig .*data\.kind = 'tokens' needs data\.path"
    ):
        check_job(tmp_path, job)
    check_job(tmp_path, job, dataS3Uri="s3://corpus/tokens")  # the node sets TRAIN_DATA_PATH


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


def test_overrides_resolve_against_the_profile():
    # The instance type changes: the variant is chosen again for it.
    v100 = load_stack_config({"instanceType": "p3.2xlarge", **BASE_CONFIG}).resolve_plan(
        "us-east-1"
    )
    assert v100.instance.type == "p3.2xlarge" and v100.variant.name != "cu130"
    # Only the node count changes (on the cluster): the profile's instance and variant stay.
    cluster = {"profile": "a100x8-80g", "cluster": "slurm", **BASE_CONFIG}
    two = load_stack_config({**cluster, "nodes": "2"}).resolve_plan("us-east-1")
    assert (two.instance.type, two.nodes) == ("p4de.24xlarge", 2)
    profile = load_stack_config(cluster).resolve_plan("us-east-1")
    assert two.variant == profile.variant
    assert two.on_demand_usd_per_hour == pytest.approx(2 * profile.on_demand_usd_per_hour)


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
