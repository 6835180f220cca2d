"""Each profile ships its job: jobs/<profile>.toml, named by Pulumi.<profile>.yaml as
gpu:trainConfig and checked at preview by the trainer's own checks for its GPUs."""

from __future__ import annotations

import tomllib

import pulumi
import pytest

from infra.config.stack_file import REPO_ROOT, stack_file_config
from infra.dryrun.mocks import RecordingMocks
from infra.dryrun.runner import run_program, run_stack_file
from infra.jobs.spool import JobSpec
from infra.knowledge.profiles import load_profiles
from tests.support.mock_runs import of_type
from tests.support.stack_runs import BUCKET_OBJECT, INSTANCE

PROFILES = tuple(load_profiles().profiles)


@pytest.fixture(autouse=True)
def _in_the_project_directory(monkeypatch):
    # The Pulumi CLI runs the program in Pulumi.yaml's directory; gpu:trainConfig is relative.
    monkeypatch.chdir(REPO_ROOT)


@pytest.mark.parametrize("profile", PROFILES)
def test_each_stack_file_names_its_profiles_job_and_ships_it(profile):
    path = REPO_ROOT / f"Pulumi.{profile}.yaml"
    assert stack_file_config(path)["gpu:trainConfig"] == f"jobs/{profile}.toml"
    run = run_stack_file(path)  # the program under mocks: preview, checks included
    job = (REPO_ROOT / "jobs" / f"{profile}.toml").read_text()
    # Shipped as the first job of the stack's job spool, never in a node's user data.
    (default,) = [
        r for r in of_type(run, BUCKET_OBJECT) if r.inputs["key"] == "jobs/default/job.json"
    ]
    assert JobSpec.model_validate_json(default.inputs["content"]).config_toml == job
    instances = of_type(run, INSTANCE)
    assert instances
    for instance in instances:
        assert job not in instance.inputs["userData"]


def test_the_jobs_are_the_workloads_their_profiles_describe():
    jobs = {p: tomllib.loads((REPO_ROOT / "jobs" / f"{p}.toml").read_text()) for p in PROFILES}
    assert jobs["l4x1"]["model"]["preset"] == "resnet-50"
    assert jobs["l4x1"]["precision"] == {"bf16": True}  # an L4 (compute capability 8.9) has it
    assert jobs["a100x8"]["model"]["preset"] == "bert-base"
    assert jobs["a100x8"]["data"]["seq_len"] == 512
    large = jobs["a100x8-80g"]
    assert large["model"]["hf"] == "Qwen/Qwen2.5-7B"  # a public model, on 8x A100 80GB
    assert large["model"]["activation_checkpointing"] and large["precision"]["bf16"]
    assert large["zero"]["stage"] == 3


def test_the_l4_job_on_a_v100_fails_preview_in_one_line(tmp_path):
    """V100 stays an explicit instance type; the shipped bf16 job is refused on it."""
    job = tmp_path / "l4x1.toml"
    job.write_text((REPO_ROOT / "jobs" / "l4x1.toml").read_text())
    config = stack_file_config(REPO_ROOT / "Pulumi.l4x1.yaml") | {
        "gpu:trainConfig": str(job),
        "gpu:instanceType": "p3.2xlarge",
    }
    mocks = RecordingMocks()
    with pytest.raises(pulumi.RunError) as raised:
        run_program(config, stack="l4x1", mocks=mocks)
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith(f"gpu:trainConfig is {str(job)!r}: the trainer would refuse it")
    assert "compute capability 7.0" in message and "use precision.fp16 = true" in message
    assert mocks.resources == []
