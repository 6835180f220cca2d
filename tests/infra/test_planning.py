"""From the parsed `gpu:` config to a checked plan: overrides, gpu:trainConfig, the trainer's
checks. Each refusal is one sentence naming the key, raised before any resource exists."""

from __future__ import annotations

from pathlib import Path

import pulumi
import pytest

from infra.config.schema import load_stack_config
from infra.dryrun.mocks import RecordingMocks
from infra.errors import ConfigError
from infra.planning import check_plan, resolve_plan, train_config_text
from tests.support.stack_runs import BASE_CONFIG, run_stack


def test_the_config_model_reads_no_file():
    # Parsing only: a missing training TOML is refused where it is read, not by the model.
    config = load_stack_config({**BASE_CONFIG, "trainConfig": "no/such/train.toml"})
    assert config.train_config == Path("no/such/train.toml")
    with pytest.raises(ConfigError) as raised:
        train_config_text(config)
    assert str(raised.value) == (
        "gpu:trainConfig is 'no/such/train.toml': not a file (give the path of a training "
        "TOML, relative to Pulumi.yaml)"
    )


def test_train_config_text_is_the_files_text(tmp_path):
    job = tmp_path / "job.toml"
    job.write_text("[train]\nsteps = 10\n")
    assert train_config_text(load_stack_config({**BASE_CONFIG, "trainConfig": str(job)})) == (
        "[train]\nsteps = 10\n"
    )
    assert train_config_text(load_stack_config(BASE_CONFIG)) is None


def test_bad_toml_in_train_config_names_the_key(tmp_path):
    broken = tmp_path / "train.toml"
    broken.write_text("[optimizer\nlr = 1e-4\n")
    mocks = RecordingMocks()
    with pytest.raises(pulumi.RunError, match=r"gpu:trainConfig is .*: not valid TOML"):
        run_stack(mocks=mocks, trainConfig=str(broken))
    assert mocks.resources == []


def test_a_train_config_larger_than_user_data_is_accepted(tmp_path):
    # It travels as the job spool's first job in S3, not in the user data (infra/jobs/spool.py).
    big = tmp_path / "train.toml"
    big.write_text("".join(f"key{i} = {i}\n" for i in range(2000)))
    assert len(big.read_bytes()) > 16 * 1024
    config = load_stack_config({**BASE_CONFIG, "trainConfig": str(big)})
    assert train_config_text(config) == big.read_text()


# A job the trainer accepts on one a100x8 node or two on the cluster (8 or 16 GPUs, compute
# capability 8.0).
BF16_JOB = "[precision]\nbf16 = true\n[train]\nglobal_batch_size = 64\nmicro_batch_size = 4\n"


def check_job(tmp_path: Path, toml: str, **config: str) -> None:
    """The stack's plan-time checks with `toml` as gpu:trainConfig."""
    job = tmp_path / "job.toml"
    job.write_text(toml)
    stack = load_stack_config({**BASE_CONFIG, **config, "trainConfig": str(job)})
    check_plan(stack, resolve_plan(stack, "us-east-1"))


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


def test_overrides_resolve_against_the_profile():
    # The instance type changes: the variant is chosen again for it.
    v100 = resolve_plan(
        load_stack_config({"instanceType": "p3.2xlarge", **BASE_CONFIG}), "us-east-1"
    )
    assert v100.instance.type == "p3.2xlarge" and v100.variant.name != "cu130"
    # Only the node count changes (on the cluster): the profile's instance and variant stay.
    cluster = {"profile": "a100x8-80g", "cluster": "slurm", **BASE_CONFIG}
    two = resolve_plan(load_stack_config({**cluster, "nodes": "2"}), "us-east-1")
    assert (two.instance.type, two.nodes) == ("p4de.24xlarge", 2)
    profile = resolve_plan(load_stack_config(cluster), "us-east-1")
    assert two.variant == profile.variant
    # p4de.24xlarge, us-east-1: $27.45/h on-demand (AWS What's New 2025-06-05, the June 2025
    # P4de price cut), two of them.
    assert two.on_demand_usd_per_hour == pytest.approx(2 * 27.45)


@pytest.mark.parametrize(
    ("market", "hourly"),
    [
        # p4d.24xlarge in us-east-1 (prices.toml): $21.96 on-demand (AWS What's New
        # 2025-06-05), $14.1051 spot (upper end seen), $11.80 a Capacity Block (EC2 Capacity
        # Blocks for ML pricing page, 2026-07-22); a reservation bills the on-demand rate.
        ({}, 21.96),
        ({"spot": "true"}, 14.1051),
        ({"capacityBlockId": "cr-0123456789abcdef0"}, 11.80),
        ({"capacityReservationId": "cr-0123456789abcdef0"}, 21.96),
    ],
)
def test_the_budget_check_uses_the_price_of_the_stacks_market(market, hourly):
    def check(budget: float) -> None:
        config = load_stack_config({**BASE_CONFIG, **market, "budgetUsd": str(budget)})
        check_plan(config, resolve_plan(config, "us-east-1"))

    check(hourly + 0.01)  # one hour fits
    with pytest.raises(ConfigError) as raised:
        check(hourly - 0.01)
    assert f"less than one hour of this stack at ${hourly:.2f}/h" in str(raised.value)


def test_a_tensor_group_wider_than_a_node_fails_the_plan(tmp_path):
    """Two a100x8 nodes: 16 GPUs, 8 per node; tensor 16 divides the world but spans nodes."""
    job = (
        '[model]\nhf = "/models/llama"\n[data]\nkind = "jsonl"\npath = "/data/a.jsonl"\n'
        "[parallel]\ntensor = 16\n"
    )
    with pytest.raises(ConfigError) as raised:
        check_job(tmp_path, job, profile="a100x8", nodes="2", cluster="slurm")
    assert str(raised.value).endswith(
        "parallel.tensor = 16 is more than the 8 GPUs of one node: a tensor group all-reduces "
        "inside every layer and must stay on one node's NVLink; use parallel.tensor <= 8"
    )
