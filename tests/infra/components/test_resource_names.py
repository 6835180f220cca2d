"""An existing stack sees no replacement: every (type, name) a stack had is still registered.

fixtures/resource_names.json was recorded from the program before its components took Args
dataclasses; Pulumi keys a resource by its type and name (its URN), so a renamed or retyped one
is deleted and created again. New resources may appear; none may vanish or change name,
unless it carries its old name as an alias (Pulumi then moves it, no replacement).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.stack_runs import run_stack

RECORDED = json.loads((Path(__file__).parent / "fixtures" / "resource_names.json").read_text())

CASES = {
    f"{profile}-{market}": {"profile": profile, "spot": market == "spot", "maxRuntimeHours": 8}
    for profile in ("l40sx4", "a100x8", "a100x8-80g", "l4x1")
    for market in ("on-demand", "spot")
}
CASES["a100x8-on-demand-default-vpc"] = {"profile": "a100x8", "useDefaultVpc": True}


def test_every_recorded_case_is_run():
    assert set(CASES) == set(RECORDED)


@pytest.mark.parametrize("case", sorted(CASES))
def test_no_recorded_resource_is_renamed_or_retyped(case):
    run = run_stack(**CASES[case])
    registered = {f"{resource.type} {resource.name}" for resource in run.resources}
    registered |= {
        f"{key.split(' ', 1)[0]} {alias}" for key, names in run.aliases.items() for alias in names
    }
    missing = sorted(set(RECORDED[case]) - registered)
    assert not missing, f"{case}: these resources would be replaced: {missing}"
