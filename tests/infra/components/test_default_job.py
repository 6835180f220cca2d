"""User data that never changes with a job or a price: the program under mocks.

A node's user data only says where its jobs are; gpu:trainConfig becomes the first job
of the spool (an S3 object `up` updates in place) and carries the price. The instance
replaces itself on a user-data change (userDataReplaceOnChange), so identical user data
is no new node; a new instance type still is one.
"""

from __future__ import annotations

import re

import pytest
import yaml

from infra.components import single_node
from infra.jobs.spool import JobSpec
from infra.knowledge.catalog import load_catalog
from infra.knowledge.profiles import resolve_profile
from tests.support.mock_runs import of_type
from tests.support.stack_runs import (
    BUCKET_OBJECT,
    INSTANCE,
    boot_env,
    nodes_in_rank_order,
    run_stack,
    written_content,
)

JOB = "[train]\nsteps = 300\nglobal_batch_size = 64\n\n[optimizer]\nlr = 3e-4\n"


def default_job(run) -> JobSpec:
    (job,) = [r for r in of_type(run, BUCKET_OBJECT) if r.inputs["key"] == "jobs/default/job.json"]
    return JobSpec.model_validate_json(job.inputs["content"])


def user_data(run) -> list[str]:
    """Each node's user data, its compressed file decoded, the mocks' made-up resource
    numbers blanked: they number resources in the order of registration
    (infra/dryrun/mocks.py), which Pulumi's asynchronous registration does not fix; in AWS
    a resource keeps its name, and the same files are the same bytes (no gzip timestamp)."""
    texts = []
    for node in nodes_in_rank_order(run):
        document = yaml.safe_load(node.inputs["userData"])
        for item in document["write_files"]:
            item["content"] = written_content(item)
        texts.append(re.sub(r"-[0-9a-f]{7}\b", "-NUMBER", yaml.safe_dump(document)))
    return texts


@pytest.mark.parametrize(("profile", "spot"), [("l4x1", True), ("a100x8", False)])
def test_no_price_and_no_training_config_reach_any_user_data(tmp_path, profile, spot):
    job = tmp_path / "job.toml"
    job.write_text(JOB)
    run = run_stack(profile=profile, spot=spot, trainConfig=str(job))
    price = load_catalog().prices.price("us-east-1", resolve_profile(profile).instance.type)
    hourly = price.spot_usd_per_hour if spot else price.on_demand_usd_per_hour  # one node
    spec = default_job(run)
    assert spec.config_toml == JOB and spec.name == "default"
    assert spec.usd_per_hour == pytest.approx(hourly, abs=1e-6)
    for node in nodes_in_rank_order(run):
        assert not {"TRAIN_USD_PER_HOUR", "TRAIN_CONFIG"} & set(boot_env(node))
        text = node.inputs["userData"]
        assert f"{hourly:.4f}" not in text and f"{hourly:.2f}" not in text
        assert "global_batch_size" not in text and "lr = 3e-4" not in text


def test_stack_files_differing_only_in_train_config_render_byte_identical_user_data(tmp_path):
    first, second = tmp_path / "first.toml", tmp_path / "second.toml"
    first.write_text(JOB)
    second.write_text(JOB.replace("lr = 3e-4", "lr = 1e-4"))
    one = run_stack(trainConfig=str(first))
    other = run_stack(trainConfig=str(second))
    assert user_data(one) == user_data(other)
    assert [n.name for n in of_type(one, INSTANCE)] == [n.name for n in of_type(other, INSTANCE)]
    # The change is the default job's object, updated in place.
    assert "lr = 1e-4" in default_job(other).config_toml
    assert default_job(one).config_toml != default_job(other).config_toml


def test_a_new_price_changes_the_default_job_and_no_user_data(tmp_path, monkeypatch):
    job = tmp_path / "job.toml"
    job.write_text(JOB)
    before = run_stack(trainConfig=str(job))
    monkeypatch.setattr(single_node, "hourly_usd", lambda plan, market: 123.4567)
    after = run_stack(trainConfig=str(job))
    assert user_data(before) == user_data(after)
    assert default_job(before).usd_per_hour != 123.4567 == default_job(after).usd_per_hour


def test_a_new_instance_type_still_replaces_the_node():
    small = run_stack(profile="l4x1")
    large = run_stack(profile="l4x1", instanceType="g5.12xlarge")
    (node,) = of_type(large, INSTANCE)
    assert node.inputs["userDataReplaceOnChange"] is True
    # The health gate's figures for the type are in the user data: a new type, a new node.
    assert user_data(small) != user_data(large)
    assert "TRAIN_EXPECT_GPUS=4" in user_data(large)[0]
