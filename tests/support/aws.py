"""moto's real AWS HTTP API in this process, on a free loopback port, for boto3 clients."""

from __future__ import annotations

import logging
import urllib.request
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto.server import ThreadedMotoServer

REGION = "us-east-1"
ACCOUNT = "123456789012"  # the account moto answers for by default
FAKE_CREDENTIALS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    """The URL of a ThreadedMotoServer on 127.0.0.1 (port chosen by the OS), one per test
    process: a test empties it with `reset`. Stopping a server waits out werkzeug's
    half-second poll, which a server per test paid every time; session scope, not module,
    lets a module's tests run on any worker."""
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


def client(endpoint: str, service: str, region: str = REGION) -> Any:
    return boto3.client(service, endpoint_url=endpoint, region_name=region, **FAKE_CREDENTIALS)


def an_image(ec2: Any) -> str:
    """The id of an Amazon Linux 2 image among moto's built-in ones: asking for all of its
    1,300 images costs each call a second or more to describe and parse."""
    images = ec2.describe_images(
        Owners=["amazon"], Filters=[{"Name": "name", "Values": ["amzn2-ami-hvm-*-x86_64-gp2"]}]
    )["Images"]
    return images[0]["ImageId"]


def reset(endpoint: str) -> None:
    """Forget every resource the server holds (moto's reset API), between tests."""
    urllib.request.urlopen(urllib.request.Request(f"{endpoint}/moto-api/reset", method="POST"))


def fleet_table(dynamodb: Any, cluster: str, status: str = "RUNNING") -> str:
    """ParallelCluster's compute-fleet status table of `cluster`, holding `status`, as its
    template makes it and clustermgtd writes it (infra/functions/fleet.py); its name."""
    from infra.functions import fleet

    table = f"{fleet.TABLE_PREFIX}{cluster}"
    dynamodb.create_table(
        TableName=table,
        KeySchema=[{"AttributeName": "Id", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "Id", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    dynamodb.put_item(
        TableName=table,
        Item={
            "Id": {"S": fleet.ITEM_ID},
            "Data": {
                "M": {
                    "status": {"S": status},
                    "lastStatusUpdatedTime": {"S": "2026-12-01 10:00:00.000000+00:00"},
                }
            },
        },
    )
    return table
