"""Run a piece of Pulumi program under the offline mocks and read what it registered."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pulumi

from infra.dryrun.run import PROJECT, Recorded, RecordingMocks

STACK = "test"


def run_under_mocks(
    program: Callable[[], Any], mocks: RecordingMocks | None = None
) -> tuple[RecordingMocks, Any]:
    """Run `program` until every resource it started is registered: (mocks, its return value)."""
    mocks = mocks if mocks is not None else RecordingMocks()
    pulumi.runtime.set_all_config({"aws:region": mocks.region})
    pulumi.runtime.reset_options(project=PROJECT, stack=STACK, preview=False)
    pulumi.runtime.set_mocks(mocks, project=PROJECT, stack=STACK, preview=False)
    result: list[Any] = []

    @pulumi.runtime.test
    def run() -> pulumi.Output:
        result.append(program())
        return pulumi.Output.from_input(None)

    run()
    return mocks, result[0]


def resolved(output: pulumi.Input[Any]) -> Any:
    """The value of an Output once the mocks have settled it (call after run_under_mocks)."""
    values: list[Any] = []

    @pulumi.runtime.test
    def read() -> pulumi.Output:
        return pulumi.Output.from_input(output).apply(values.append)

    read()
    return values[0]


def of_type(mocks: RecordingMocks, resource_type: str) -> list[Recorded]:
    return [resource for resource in mocks.resources if resource.type == resource_type]


def one(mocks: RecordingMocks, resource_type: str) -> Recorded:
    (resource,) = of_type(mocks, resource_type)
    return resource
