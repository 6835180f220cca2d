"""The quota preflight: Service Quotas' answer, stubbed with botocore's Stubber (moto's server
does not serve EC2 quotas), decides before any resource exists."""

from __future__ import annotations

import tomllib

import boto3
import pulumi
import pytest
from botocore.stub import Stubber

from infra.dryrun.mocks import RecordingMocks
from infra.errors import ConfigError
from infra.knowledge.quotas import QUOTAS_PATH, instance_family, quota_need
from infra.knowledge.resolver import resolve
from infra.preflight.quotas import OFFLINE_ENV, check_quota, preflight_quota
from tests.support.stack_runs import run_stack

REGION = "us-east-1"
P4D_VCPUS = tomllib.loads((QUOTAS_PATH.parent / "instances.toml").read_text())["instance"][
    "p4d.24xlarge"
]["vcpus"]


def quotas_client(stub):
    client = boto3.client(
        "service-quotas", region_name=REGION, aws_access_key_id="x", aws_secret_access_key="x"
    )
    stubber = Stubber(client)
    stub(stubber)
    stubber.activate()
    return client, stubber


def quota(code: str, name: str, value: float) -> dict:
    return {"QuotaCode": code, "QuotaName": name, "Value": value, "ServiceCode": "ec2"}


def test_a_quota_of_zero_refuses_in_one_line_naming_it():
    need = quota_need(resolve("p4d.24xlarge"), "on-demand")
    client, stubber = quotas_client(
        lambda s: s.add_response(
            "get_service_quota",
            {"Quota": quota("L-417A185B", "Running On-Demand P instances", 0.0)},
            {"ServiceCode": "ec2", "QuotaCode": "L-417A185B"},
        )
    )
    with pytest.raises(ConfigError) as raised:
        check_quota(need, client, REGION)
    message = str(raised.value)
    assert "\n" not in message
    for words in (
        "'Running On-Demand P instances' (L-417A185B) in us-east-1 is 0 vCPUs",
        f"1 x p4d.24xlarge (on-demand) needs {P4D_VCPUS}",
        f"--quota-code L-417A185B --desired-value {P4D_VCPUS}",
    ):
        assert words in message, message
    stubber.assert_no_pending_responses()


def test_enough_quota_passes_and_says_what_it_read():
    need = quota_need(resolve("p4d.24xlarge"), "on-demand")
    client, _ = quotas_client(
        lambda s: s.add_response(
            "get_service_quota",
            {"Quota": quota("L-417A185B", "Running On-Demand P instances", 96.0)},
        )
    )
    assert f"{P4D_VCPUS} vCPUs, the stack needs {P4D_VCPUS}" in check_quota(need, client, REGION)


def test_a_spot_quota_is_found_by_its_name():
    need = quota_need(resolve("p4d.24xlarge"), "spot")
    assert need.code is None
    client, _ = quotas_client(
        lambda s: s.add_response(
            "list_service_quotas",
            {
                "Quotas": [
                    quota("L-AAAAAAAA", "All P5 Spot Instance Requests", 192.0),
                    quota("L-BBBBBBBB", "All P4, P3 and P2 Spot Instance Requests", 0.0),
                ]
            },
        )
    )
    with pytest.raises(
        ConfigError, match=r"'All P4, P3 and P2 Spot Instance Requests' \(L-BBBBBBBB\)"
    ):
        check_quota(need, client, REGION)


@pytest.mark.parametrize(
    ("instance_type", "family"),
    [("p4d.24xlarge", "p4"), ("p5en.48xlarge", "p5"), ("g6e.xlarge", "g6"), ("p3.2xlarge", "p3")],
)
def test_family_is_letter_and_generation(instance_type, family):
    assert instance_family(instance_type) == family


def test_every_catalog_type_has_a_quota_in_each_market():
    for instance_type in tomllib.loads((QUOTAS_PATH.parent / "instances.toml").read_text())[
        "instance"
    ]:
        for market in ("on-demand", "spot"):
            assert quota_need(resolve(instance_type), market) is not None, (instance_type, market)


def test_the_program_refuses_before_any_resource_when_the_preflight_does(monkeypatch):
    def refuse(need, *, region, profile):
        raise ConfigError(f"the EC2 quota {need.name!r} is 0 vCPUs")

    monkeypatch.setattr("infra.preflight.quotas.preflight_quota", refuse)
    mocks = RecordingMocks()
    with pytest.raises(pulumi.RunError, match="'Running On-Demand P instances' is 0 vCPUs"):
        run_stack(mocks=mocks, profile="a100x8")
    assert mocks.resources == []


def test_without_credentials_the_check_is_skipped_and_said_so(monkeypatch, tmp_path):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE", OFFLINE_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    need = quota_need(resolve("p4d.24xlarge"), "on-demand")
    note = preflight_quota(need, region=REGION, profile=None)
    assert note == "no AWS credentials: the 'Running On-Demand P instances' quota was not checked"
