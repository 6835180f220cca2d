"""`run --code DIR`, checked on the user's machine before anything is uploaded: every Python
file compiles, requirements.txt agrees with the image's lock (images/locks/<variant>.txt,
the versions the node's image has installed), and a builder the config names from the
folder ("package.module:function") is defined there. Seconds, no import of the user's code
(its imports may need the image's packages, e.g. torch), so a job that would die on the
node with a SyntaxError or a version conflict is refused here in one line.
"""

from __future__ import annotations

import ast
import importlib.metadata
from pathlib import Path

from images.locks import lock_path, normalize, read_lock
from images.matrix import Variant
from infra.errors import ConfigError
from training.code import REQUIREMENTS, requirements_against
from training.spec.config import Config

# Left out of a --code archive: caches and version control, never the job's code.
NOT_CODE = frozenset(
    {"__pycache__", ".git", ".venv", ".mypy_cache", ".pytest_cache", ".ruff_cache"}
)


def code_files(folder: Path) -> list[Path]:
    """The folder's files as the job ships them, caches left out, in a stable order."""
    return [
        path
        for path in sorted(folder.rglob("*"))
        if path.is_file() and not NOT_CODE.intersection(path.relative_to(folder).parts)
    ]


def check_code(folder: Path, job: Config, variant: Variant | None) -> None:
    """ConfigError, naming the file and line, for code the node would refuse or crash on.
    Its requirements are checked against the image of `variant`, or against this Python
    environment's packages when None (the local stack runs the job here)."""
    trees = {path: _compiled(folder, path) for path in code_files(folder) if path.suffix == ".py"}
    if variant is None:
        version_of, whose = _installed, "this environment's"
    else:
        lock = read_lock(lock_path(variant))

        def version_of(name: str) -> str | None:
            pin = lock.pins.get(normalize(name))
            return pin.version if pin is not None else None

        whose = f"the {variant.name} image's"
    try:
        requirements_against(folder / REQUIREMENTS, version_of, whose)
    except ConfigError as exc:
        raise ConfigError(f"--code {folder}: {exc}") from None
    for key, builder in (("model.builder", job.model.builder), ("data.builder", job.data.builder)):
        if builder is not None:
            _check_builder(folder, trees, key, builder)


def _installed(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _compiled(folder: Path, path: Path) -> ast.Module:
    try:
        source = path.read_bytes()
        return ast.parse(source, filename=str(path))
    except SyntaxError as exc:
        where = f"{path.relative_to(folder)} line {exc.lineno}"
        raise ConfigError(
            f"--code {folder}: {where}: {exc.msg} (the job would fail there on the node): "
            "fix it, `python -m py_compile FILE` checks it"
        ) from None
    except (OSError, ValueError) as exc:  # unreadable, or a NUL byte in the source
        raise ConfigError(f"--code {folder}: {path.relative_to(folder)}: {exc}") from None


def _check_builder(folder: Path, trees: dict[Path, ast.Module], key: str, builder: str) -> None:
    """A builder whose package is in the folder must be defined at its module's top level;
    one from elsewhere (an installed package of the image) is the node's to import."""
    module, _, function = builder.partition(":")
    parts = module.split(".")
    if not (folder / parts[0]).is_dir() and not (folder / f"{parts[0]}.py").is_file():
        return
    candidates = [
        folder.joinpath(*parts).with_suffix(".py"),
        folder.joinpath(*parts, "__init__.py"),
    ]
    found = next((path for path in candidates if path in trees), None)
    if found is None:
        raise ConfigError(
            f"{key} = {builder!r}: --code {folder} has {parts[0]} but no module {module} "
            f"(looked for {', '.join(str(p.relative_to(folder)) for p in candidates)})"
        )
    defined = _top_level_names(trees[found])
    if function not in defined:
        raise ConfigError(
            f"{key} = {builder!r}: {found.relative_to(folder)} in --code {folder} defines no "
            f"{function!r} at its top level"
        )


def _top_level_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names
