"""Run a piece of Pulumi program under the offline mocks and read what it registered.

The same runner as the offline plan (infra.dryrun.runner): one way of setting mocks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pulumi

from infra.dryrun.mocks import Recorded, RecordingMocks
from infra.dryrun.runner import ProgramRun
from infra.dryrun.runner import run_under_mocks as run_piece

STACK = "test"


def run_under_mocks(
    program: Callable[[], Any], mocks: RecordingMocks | None = None
) -> tuple[RecordingMocks, Any]:
    """Run `program` until every resource it started is registered: (mocks, its return value)."""
    mocks = mocks if mocks is not None else RecordingMocks()
    _, result = run_piece(program, config={"aws:region": mocks.region}, mocks=mocks, stack=STACK)
    return mocks, result


def resolved(output: pulumi.Input[Any]) -> Any:
    """The value of an Output once the mocks have settled it (call after run_under_mocks)."""
    values: list[Any] = []

    @pulumi.runtime.test
    def read() -> pulumi.Output:
        return pulumi.Output.from_input(output).apply(values.append)

    read()
    return values[0]


def of_type(recorded: RecordingMocks | ProgramRun, resource_type: str) -> list[Recorded]:
    return [resource for resource in recorded.resources if resource.type == resource_type]


def one(recorded: RecordingMocks | ProgramRun, resource_type: str) -> Recorded:
    """The only resource of `resource_type` (fails the test when there are none or several)."""
    found = of_type(recorded, resource_type)
    assert len(found) == 1, f"expected one {resource_type}, found {len(found)}"
    return found[0]
