"""The pure layers import without Pulumi: the offline plan and the data checks run anywhere.

Each module of infra.knowledge, infra.config, infra.node and infra.report is imported in a fresh
interpreter where any `pulumi*` import raises ImportError.
"""

from __future__ import annotations

import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import infra.config
import infra.knowledge
import infra.node

REPO_ROOT = Path(__file__).resolve().parents[3]

PURE_MODULES = sorted(
    {"infra.report"}
    | {
        info.name
        for package in (infra.knowledge, infra.config, infra.node)
        for info in pkgutil.walk_packages(package.__path__, prefix=f"{package.__name__}.")
    }
)

# A finder ahead of every other one that refuses pulumi and its submodules and plugins.
_WITHOUT_PULUMI = """
import importlib, sys
class NoPulumi:
    def find_spec(self, name, path=None, target=None):
        if name == "pulumi" or name.startswith(("pulumi.", "pulumi_")):
            raise ImportError(f"{name} is not importable here")
        return None
sys.meta_path.insert(0, NoPulumi())
for module in sys.argv[1:]:
    importlib.import_module(module)
"""


def _import_without_pulumi(*modules: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", _WITHOUT_PULUMI, *modules],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_pure_layers_have_modules():
    assert {"infra.knowledge.layout", "infra.config.schema", "infra.node.boot"} <= set(PURE_MODULES)


@pytest.mark.parametrize("module", PURE_MODULES)
def test_imports_without_pulumi(module):
    result = _import_without_pulumi(module)
    assert result.returncode == 0, result.stderr


def test_a_module_that_imports_pulumi_fails_there():
    """The blocker works: a component module cannot be imported with it."""
    result = _import_without_pulumi("infra.components.storage")
    assert result.returncode != 0
    assert "pulumi is not importable here" in result.stderr


def test_the_plan_without_resources_runs_without_pulumi():
    program = _WITHOUT_PULUMI.replace(
        "for module in sys.argv[1:]:\n    importlib.import_module(module)\n",
        "import runpy\nsys.argv = ['infra', 'plan', 'a100x8']\n"
        "runpy.run_module('infra', run_name='__main__')\n",
    )
    result = subprocess.run(
        [sys.executable, "-c", program], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert "p4d.24xlarge" in result.stdout
