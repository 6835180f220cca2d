"""No import cycle inside infra/, and none between the product's packages: each module, and each
package (infra.config, infra.knowledge, training.spec, ...), can be read and tested after the
ones it imports."""

from __future__ import annotations

from pathlib import Path

from tests.support.imports import find_cycle, import_graph, package_graph

REPO_ROOT = Path(__file__).resolve().parents[2]
PRODUCT_PACKAGES = ("infra", "training", "images", "common", "bench")


def _package(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_infra_has_no_import_cycle():
    graph = import_graph(REPO_ROOT, "infra")
    assert "infra.knowledge.catalog" in graph["infra.knowledge.resolver"]  # the graph sees imports
    assert find_cycle(graph) is None


def test_the_products_packages_import_each_other_without_a_cycle():
    packages = package_graph(import_graph(REPO_ROOT, *PRODUCT_PACKAGES))
    assert "infra.knowledge" in packages["infra.config"]  # the graph sees package imports
    assert "training.spec" in packages["infra.planning"]  # and those across top-level ones
    assert find_cycle(packages) is None


def test_the_config_models_parse_values_only():
    # Reading files, the trainer's checks and the boot scripts are infra.planning's.
    modules = import_graph(REPO_ROOT, *PRODUCT_PACKAGES)
    models = package_graph(
        {name: modules[name] for name in ("infra.config.schema", "infra.config.guardrails")}
    )
    assert models["infra.config"] == {
        "common.errors",
        "common.market",
        "infra.errors",
        "infra.knowledge",  # MAX_NODES
    }


def test_two_packages_whose_modules_import_each_other_are_a_package_cycle(tmp_path):
    # Module level: config.schema -> knowledge.costs -> config.guardrails, no cycle.
    root = _package(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/config/__init__.py": "",
            "pkg/config/schema.py": "from pkg.knowledge.costs import price\n",
            "pkg/config/guardrails.py": "",
            "pkg/knowledge/__init__.py": "",
            "pkg/knowledge/costs.py": "from ..config import guardrails\n",
            "pkg/cli.py": "from pkg.config import schema\n",
        },
    )
    modules = import_graph(root, "pkg")
    assert find_cycle(modules) is None
    packages = package_graph(modules)
    assert packages["pkg.cli"] == {"pkg.config"}
    cycle = find_cycle(packages)
    assert cycle is not None and set(cycle) == {"pkg.config", "pkg.knowledge"}


def test_a_cycle_through_a_relative_and_a_type_checking_import_is_found(tmp_path):
    root = _package(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "from pkg.sub import b\n",
            "pkg/sub/__init__.py": "",
            "pkg/sub/b.py": "from . import c\n",
            "pkg/sub/c.py": (
                "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..a import x\n"
            ),
            "pkg/leaf.py": "import os\n",
        },
    )
    cycle = find_cycle(import_graph(root, "pkg"))
    assert cycle is not None
    assert set(cycle) == {"pkg.a", "pkg.sub.b", "pkg.sub.c"} and cycle[0] == cycle[-1]


def test_a_chain_without_a_cycle_passes(tmp_path):
    root = _package(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "from pkg import b\nimport pkg.c\n",
            "pkg/b.py": "from .c import thing\n",
            "pkg/c.py": "thing = 1\n",
        },
    )
    graph = import_graph(root, "pkg")
    assert graph["pkg.a"] == {"pkg", "pkg.b", "pkg.c"} and graph["pkg.b"] == {"pkg.c"}
    assert find_cycle(graph) is None
