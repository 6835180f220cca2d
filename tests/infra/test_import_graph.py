"""No import cycle inside infra/: each module can be read (and tested) after the ones it imports."""

from __future__ import annotations

from pathlib import Path

from tests.support.imports import find_cycle, import_graph

REPO_ROOT = Path(__file__).resolve().parents[2]


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
