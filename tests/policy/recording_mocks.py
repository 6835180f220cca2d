"""Pulumi mocks that record every resource a program registers, for assertions and policy checks."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pulumi

REGION = "us-east-1"
ACCOUNT = "123456789012"
PROJECT = "gpu-training-stack"
STACK = "test"


@dataclass(frozen=True)
class Registered:
    """One resource as the engine saw it: type token, logical name, inputs (camelCase), id, and
    the outputs the mocks answered (the state a stack policy sees)."""

    type: str
    name: str
    inputs: dict[str, Any]
    id: str
    outputs: dict[str, Any]


class RecordingMocks(pulumi.runtime.Mocks):
    """Echoes inputs back as outputs, with plausible ids and ARNs, and answers the AWS lookups."""

    def __init__(self) -> None:
        self.resources: list[Registered] = []
        self.result: Any = None  # what the program returned

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict[str, Any]]:
        digest = hashlib.sha256(args.name.encode()).hexdigest()
        resource_id = f"i-{digest[:17]}" if args.typ == "aws:ec2/instance:Instance" else args.name
        outputs = dict(args.inputs)
        service = args.typ.split(":")[1].split("/")[0]
        outputs.setdefault("arn", f"arn:aws:{service}:{REGION}:{ACCOUNT}:{args.name}")
        outputs.setdefault("name", args.name)
        if args.typ == "aws:budgets/budgetAction:BudgetAction":
            outputs["actionId"] = f"action-{digest[:8]}"
        if args.typ in ("aws:s3/bucket:Bucket", "aws:s3/bucketV2:BucketV2"):
            outputs.setdefault("bucket", args.name)
        self.resources.append(
            Registered(args.typ, args.name, dict(args.inputs), resource_id, outputs)
        )
        return resource_id, outputs

    def call(self, args: pulumi.runtime.MockCallArgs) -> dict[str, Any]:
        if args.token == "aws:index/getRegion:getRegion":
            return {"id": REGION, "name": REGION, "region": REGION}
        if args.token == "aws:index/getCallerIdentity:getCallerIdentity":
            return {
                "id": ACCOUNT,
                "accountId": ACCOUNT,
                "arn": f"arn:aws:iam::{ACCOUNT}:user/tester",
                "userId": "AIDATESTER",
            }
        raise NotImplementedError(f"no mock answer for {args.token}")

    def of_type(self, resource_type: str) -> list[Registered]:
        return [resource for resource in self.resources if resource.type == resource_type]

    def one(self, resource_type: str) -> Registered:
        (resource,) = self.of_type(resource_type)
        return resource


def run_program(program: Callable[[], Any], mocks: RecordingMocks | None = None) -> RecordingMocks:
    """Run `program` under fresh mocks until every resource it started is registered."""
    mocks = mocks if mocks is not None else RecordingMocks()
    pulumi.runtime.set_mocks(mocks, project=PROJECT, stack=STACK, preview=False)
    result: list[Any] = []

    @pulumi.runtime.test
    def run() -> Any:
        result.append(program())
        return pulumi.Output.from_input(None)

    run()
    mocks.result = result[0]
    return mocks


def resolved(output: pulumi.Input[Any]) -> Any:
    """The value of an Output once the mocks have settled it (call after run_program)."""
    values: list[Any] = []

    @pulumi.runtime.test
    def read() -> Any:
        return pulumi.Output.from_input(output).apply(values.append)

    read()
    return values[0]
