"""infra/functions/ deploys as a plain archive: its code imports only what Lambda provides."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import infra.functions
from infra.components.spend_guard import LAMBDA_SHARED
from tests.test_requirements import third_party_imports

FUNCTIONS = Path(infra.functions.__file__).parent
LAMBDA_PROVIDES = {"boto3", "botocore"}  # the Python runtimes include the AWS SDK


def _local_imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return {name for name in names if name.split(".")[0] in ("infra", "common")}


def test_every_module_imports_only_the_standard_library_and_the_aws_sdk():
    modules = sorted(FUNCTIONS.glob("*.py"))
    assert {path.name for path in modules} >= {"spend_guard.py", "ledger.py", "settings.py"}
    for path in modules:
        assert third_party_imports(path) <= LAMBDA_PROVIDES, path.name
        outside = {
            n
            for n in _local_imports(path)
            if not n.startswith("infra.functions")
            and n not in {f"common.{name}" for name in LAMBDA_SHARED}
        }
        assert outside == set(), f"{path.name} imports {outside}, which the archive lacks"


def test_the_check_sees_an_import_lambda_lacks(tmp_path):
    module = tmp_path / "handler.py"
    module.write_text("import boto3\nimport pydantic\nimport json\n")
    assert third_party_imports(module) - LAMBDA_PROVIDES == {"pydantic"}
    assert "json" in sys.stdlib_module_names
