"""No module imports another package's `_private` name: what crosses a package is public."""

from __future__ import annotations

import ast
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("infra", "training", "bench", "images", "policy", "common")


def _module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _package_of(module: str, path: Path) -> str:
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


def _absolute(node: ast.ImportFrom, package: str) -> str:
    """The module a `from ... import` names; a relative one counts from the importer's package."""
    if not node.level:
        return node.module or ""
    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
    return ".".join([*parts, node.module] if node.module else parts)


def private_imports_across_packages(root: Path = REPO_ROOT) -> list[str]:
    found = []
    for top in PACKAGES:
        for path in sorted((root / top).rglob("*.py")):
            module = _module_name(path, root)
            package = _package_of(module, path)
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if not isinstance(node, ast.ImportFrom):
                    continue
                source = _absolute(node, package)
                if source == package or source.rpartition(".")[0] == package:
                    continue  # a module of the importer's own package
                for alias in node.names:
                    if alias.name.startswith("_") and not alias.name.startswith("__"):
                        line = f"{path.relative_to(root)}:{node.lineno}"
                        found.append(f"{line} imports {alias.name} from {source}")
    return found


def test_no_module_imports_a_private_name_from_another_package():
    assert private_imports_across_packages() == []


def test_the_check_finds_a_private_name_imported_across_packages(tmp_path):
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "loop.py").write_text(
        "from training.trainer import _seed_everything, param_groups\n"
        "from bench.measure import _timed\n"  # its own package: allowed
    )
    for top in PACKAGES[:1] + PACKAGES[2:]:
        (tmp_path / top).mkdir(exist_ok=True)
    (tmp_path / "training").mkdir()
    assert private_imports_across_packages(tmp_path) == [
        "bench/loop.py:1 imports _seed_everything from training.trainer"
    ]
