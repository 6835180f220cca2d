"""A moto server (EC2, DynamoDB, SNS, SQS) for the spend guard, and its ledger table."""

from __future__ import annotations

import pytest

from infra.functions.ledger import PERIOD_KEY
from tests.support.aws import client, moto_server, reset


@pytest.fixture(scope="module")
def endpoint():
    with moto_server() as url:
        yield url


@pytest.fixture
def aws(endpoint):
    """Fresh clients against an emptied server, with the guard's ledger table created."""
    reset(endpoint)
    clients = {name: client(endpoint, name) for name in ("ec2", "dynamodb", "sns", "sqs")}
    clients["dynamodb"].create_table(
        TableName="ledger",
        KeySchema=[{"AttributeName": PERIOD_KEY, "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": PERIOD_KEY, "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    return clients
