"""The import graph of a package, read from its source with ast (nothing is imported)."""

from __future__ import annotations

import ast
from pathlib import Path


def module_names(root: Path, package: str) -> dict[str, Path]:
    """Dotted name -> file of every module under root/package (a package is its __init__)."""
    modules = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def import_graph(root: Path, *packages: str) -> dict[str, set[str]]:
    """Module -> the modules of `packages` it imports (TYPE_CHECKING imports count too:
    a cycle hidden behind them is still two modules that cannot be read apart)."""
    modules = {
        name: path for package in packages for name, path in module_names(root, package).items()
    }
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = _absolute(name, is_package, node.module, node.level)
                targets.add(base)
                targets.update(f"{base}.{alias.name}" for alias in node.names)
        graph[name] = {target for target in targets if target in modules and target != name}
    return graph


def package_graph(graph: dict[str, set[str]], depth: int = 2) -> dict[str, set[str]]:
    """The module graph seen a level up: infra.config.schema counts as infra.config, a module
    at the top of a package (infra.cli) as itself. Two packages that import each other are a
    cycle here even when no two of their modules are."""
    packages: dict[str, set[str]] = {}
    for module, imported in graph.items():
        unit = _unit(module, depth)
        targets = packages.setdefault(unit, set())
        targets.update(_unit(target, depth) for target in imported)
        targets.discard(unit)
    return packages


def _unit(module: str, depth: int) -> str:
    return ".".join(module.split(".")[:depth])


def _absolute(module: str, is_package: bool, target: str | None, level: int) -> str:
    if level == 0:
        return target or ""
    parts = module.split(".")
    anchor = parts if is_package else parts[:-1]
    anchor = anchor[: len(anchor) - (level - 1)]
    return ".".join([*anchor, target] if target else anchor)


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as [a, b, ..., a], or None when the graph has none."""
    state: dict[str, str] = {}  # "open" while on the current path, "done" after

    def visit(module: str, path: list[str]) -> list[str] | None:
        state[module] = "open"
        for imported in sorted(graph.get(module, ())):
            if state.get(imported) == "open":
                return [*path[path.index(imported) :], imported]
            if imported not in state:
                cycle = visit(imported, [*path, imported])
                if cycle:
                    return cycle
        state[module] = "done"
        return None

    for module in sorted(graph):
        if module not in state:
            cycle = visit(module, [module])
            if cycle:
                return cycle
    return None
