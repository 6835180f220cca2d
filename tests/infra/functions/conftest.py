"""A moto server (EC2, DynamoDB, SNS, SQS) for the spend guard, its ledger table and its
alert topic."""

from __future__ import annotations

import pytest

from infra.functions.ledger import PERIOD_KEY
from tests.support.aws import client, reset


@pytest.fixture
def aws(moto_endpoint):
    """Fresh clients against an emptied server, with the guard's ledger table created."""
    reset(moto_endpoint)
    clients = {name: client(moto_endpoint, name) for name in ("ec2", "dynamodb", "sns", "sqs")}
    clients["dynamodb"].create_table(
        TableName="ledger",
        KeySchema=[{"AttributeName": PERIOD_KEY, "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": PERIOD_KEY, "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    return clients


@pytest.fixture
def topic(aws):
    """The alert topic with an SQS queue subscribed, so a test reads what was published."""
    arn = aws["sns"].create_topic(Name="alerts")["TopicArn"]
    queue_url = aws["sqs"].create_queue(QueueName="alerts")["QueueUrl"]
    queue_arn = aws["sqs"].get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])[
        "Attributes"
    ]["QueueArn"]
    aws["sns"].subscribe(TopicArn=arn, Protocol="sqs", Endpoint=queue_arn)
    return arn, queue_url
