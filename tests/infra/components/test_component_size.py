"""Every component's constructor reads in one screen: at most 80 lines."""

from __future__ import annotations

import ast
import importlib
import inspect

import pulumi
import pytest

from tests.training.multirank import REPO_ROOT

MOST_LINES = 80
COMPONENTS_DIR = REPO_ROOT / "infra" / "components"


def _constructors() -> list[tuple[str, int]]:
    """(module:Class, lines of __init__) for every class defined in infra/components."""
    found = []
    for path in sorted(COMPONENTS_DIR.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ClassDef):
                continue
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                    found.append((f"{path.stem}:{node.name}", item.end_lineno - item.lineno + 1))
    return found


def test_every_component_in_the_package_is_measured():
    measured = {name for name, _ in _constructors()}
    # The ComponentResource subclasses, found by import rather than by parsing.
    components = set()
    for path in COMPONENTS_DIR.glob("*.py"):
        module = importlib.import_module(f"infra.components.{path.stem}")
        for name, value in inspect.getmembers(module, inspect.isclass):
            if issubclass(value, pulumi.ComponentResource) and value.__module__ == module.__name__:
                components.add(f"{path.stem}:{name}")
    assert components <= measured
    assert {"single_node:SingleNodeStack", "cluster_stack:ClusterStack"} <= components


@pytest.mark.parametrize("component, lines", _constructors(), ids=lambda v: str(v))
def test_constructor_fits_one_screen(component, lines):
    assert lines <= MOST_LINES, f"{component}.__init__ is {lines} lines; split it into helpers"
