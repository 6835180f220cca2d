"""The spot-request canceller: its delete, run against moto's EC2 API, leaves no open request.

moto's server fulfils a persistent spot request with a running instance, as EC2 does; the
provider's create and delete run as the Pulumi engine would call them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import boto3
import pytest
from botocore.stub import Stubber

from infra.components.spot_request import SpotRequestProvider
from tests.support.aws import an_image, reset
from tests.support.mock_runs import of_type
from tests.support.stack_runs import INSTANCE, run_stack

CANCELLER = "pulumi-python:dynamic:Resource"
REGION = "us-east-1"
REPO_ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def ec2(monkeypatch, moto_endpoint):
    reset(moto_endpoint)
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    return boto3.client("ec2", region_name=REGION)


def cancellers(run):
    return [r for r in of_type(run, CANCELLER) if r.name.endswith("-spot-request")]


def spot_node(ec2) -> tuple[str, str]:
    """(request id, instance id) of a persistent, stop-on-interruption spot node."""
    image = an_image(ec2)
    (request,) = ec2.request_spot_instances(
        Type="persistent",
        InstanceInterruptionBehavior="stop",
        LaunchSpecification={"ImageId": image, "InstanceType": "p4d.24xlarge"},
    )["SpotInstanceRequests"]
    request = ec2.describe_spot_instance_requests(
        SpotInstanceRequestIds=[request["SpotInstanceRequestId"]]
    )["SpotInstanceRequests"][0]
    assert request["State"] == "active" and request["InstanceId"]
    return request["SpotInstanceRequestId"], request["InstanceId"]


def test_delete_cancels_the_request_and_terminates_its_instance(ec2):
    request_id, instance_id = spot_node(ec2)
    provider = SpotRequestProvider()
    created = provider.create(
        {"spot_request_id": request_id, "instance_id": instance_id, "region": REGION}
    )
    assert created.id == request_id
    provider.delete(created.id, created.outs)

    # EC2 lists a cancelled request as "cancelled"; moto drops it: either way it is not open.
    # (Only this request: moto's backend is one per process, shared with other tests' servers.)
    requests = ec2.describe_spot_instance_requests()["SpotInstanceRequests"]
    mine = [r for r in requests if r["SpotInstanceRequestId"] == request_id]
    assert all(r["State"] == "cancelled" for r in mine), mine
    (reservation,) = ec2.describe_instances(InstanceIds=[instance_id])["Reservations"]
    assert reservation["Instances"][0]["State"]["Name"] == "terminated"


def test_a_request_and_instance_already_gone_count_as_deleted(monkeypatch):
    """A retried destroy: EC2 answers NotFound for both (EC2 API error codes); moto's server
    fails on an unknown request id instead, so this answer is stubbed."""
    client = boto3.client(
        "ec2", region_name=REGION, aws_access_key_id="x", aws_secret_access_key="x"
    )
    stubber = Stubber(client)
    stubber.add_client_error(
        "cancel_spot_instance_requests", service_error_code="InvalidSpotInstanceRequestID.NotFound"
    )
    stubber.add_client_error("terminate_instances", service_error_code="InvalidInstanceID.NotFound")
    monkeypatch.setattr(boto3.Session, "client", lambda self, *args, **kwargs: client)
    with stubber:
        SpotRequestProvider().delete(
            "sir-1", {"spot_request_id": "sir-1", "instance_id": "i-1", "region": REGION}
        )
    stubber.assert_no_pending_responses()


def test_a_new_node_replaces_the_canceller_delete_first():
    old = {"spot_request_id": "sir-1", "instance_id": "i-1", "region": REGION}
    diff = SpotRequestProvider().diff("sir-1", old, {**old, "instance_id": "i-2"})
    assert diff.changes and diff.replaces == ["instance_id"] and diff.delete_before_replace
    assert not SpotRequestProvider().diff("sir-1", old, dict(old)).changes


def test_every_spot_node_has_a_canceller_for_its_own_request():
    run = run_stack(spot=True, **{"aws:profile": "research"})
    (node,) = of_type(run, INSTANCE)
    (canceller,) = cancellers(run)
    assert canceller.inputs["spot_request_id"] == node.state["spotInstanceRequestId"]
    assert canceller.inputs["instance_id"] == node.id
    assert (canceller.inputs["region"], canceller.inputs["profile"]) == ("us-east-1", "research")
    assert f"{CANCELLER} {canceller.name}" in run.delete_before_replace


def test_an_on_demand_node_has_none():
    assert cancellers(run_stack(spot=False)) == []


def test_the_engine_can_load_the_serialized_provider_from_the_project_directory():
    """Pulumi pickles a dynamic provider (dill) into the resource's inputs; its provider host
    (`python -m pulumi.dynamic`, started in the project directory) loads it there. The class
    is pickled by reference, so it must import from the project directory alone."""
    (canceller,) = cancellers(run_stack(spot=True))
    serialized = canceller.inputs["__provider"]
    serialized = serialized["value"] if isinstance(serialized, dict) else serialized
    load = (
        "import base64, sys, dill; "
        "provider = dill.loads(base64.b64decode(sys.argv[1])); "
        "print(type(provider).__name__)"
    )
    result = subprocess.run(
        [sys.executable, "-c", load, serialized],
        cwd=REPO_ROOT,
        env={"PATH": os.environ["PATH"]},  # no PYTHONPATH: only what the directory holds
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "SpotRequestProvider"
