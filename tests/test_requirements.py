"""Each entry point's imports are covered by the requirements file that installs it.

`pulumi up` installs only requirements.txt (Pulumi.yaml), the policy pack only
policy/requirements.txt, the image only the trainer's lock: a third-party module
that the code reaches but its file does not name works here, where the dev venv
has everything, and fails on a user's laptop.
"""

from __future__ import annotations

import ast
import re
import sys
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LOCAL_PACKAGES = {"infra", "images", "training"}
# Imported by infra/cli.py for `gpu-stack train|estimate|export`, and by the plan's memory
# line (infra/planning.py), only where the `train` extra is installed.
TRAINER_COMMANDS = frozenset({"training.cli", "training.startup", "training.estimate"})
# images/locks.py imports uv only to write a lock (`python -m images lock`), a maintainer's
# command whose tools come from requirements-dev.txt.
LOCK_WRITER = frozenset({"uv"})


def _module_file(name: str, search: list[Path]) -> Path | None:
    relative = Path(*name.split("."))
    for root in search:
        for candidate in (root / relative.with_suffix(".py"), root / relative / "__init__.py"):
            if candidate.exists():
                return candidate
    return None


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            # `from pkg import sub` may name a submodule.
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def third_party_imports(entry: Path, optional: frozenset[str] = frozenset()) -> set[str]:
    """Top-level third-party modules reachable from `entry` through local imports, except
    through the local modules in `optional` (a feature of another extra)."""
    search = [entry.parent, REPO]
    seen: set[Path] = set()
    queue = [entry]
    found: set[str] = set()
    while queue:
        path = queue.pop()
        if path in seen:
            continue
        seen.add(path)
        for name in _imports(path):
            top = name.split(".")[0]
            if name in optional or top in optional:
                continue
            local = _module_file(name, search)
            if local is not None:
                queue.append(local)
                # A package's __init__ runs before any of its submodules.
                parts = name.split(".")
                for depth in range(1, len(parts)):
                    parent = _module_file(".".join(parts[:depth]), search)
                    if parent is not None:
                        queue.append(parent)
            elif (
                top not in sys.stdlib_module_names
                and top not in LOCAL_PACKAGES
                and _module_file(top, search) is None
            ):
                found.add(top)
    return found


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def required_distributions(requirements: Path) -> set[str]:
    names = set()
    for line in requirements.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line.startswith("-r "):
            names |= required_distributions(requirements.parent / line[3:].strip())
        elif line:
            names.add(_canonical(re.split(r"[<>=!~\[; ]", line, maxsplit=1)[0]))
    return names


def missing_distributions(
    entry: Path, requirements: Path, optional: frozenset[str] = frozenset()
) -> dict[str, list[str]]:
    distributions = packages_distributions()
    required = required_distributions(requirements)
    missing = {}
    for module in sorted(third_party_imports(entry, optional)):
        providers = [_canonical(d) for d in distributions.get(module, [module])]
        if not required.intersection(providers):
            missing[module] = providers
    return missing


@pytest.mark.parametrize(
    ("entry", "requirements"),
    [
        ("__main__.py", "requirements.txt"),  # the Pulumi program on a user's laptop
        ("infra/__main__.py", "requirements.txt"),  # the command line, in the same venv
        ("policy/__main__.py", "policy/requirements.txt"),  # the policy pack's own venv
        ("training/__main__.py", "requirements-train.txt"),  # the trainer outside an image
    ],
)
def test_every_import_is_in_its_requirements_file(entry, requirements):
    # The command line runs the trainer's commands (`gpu-stack train`) only where the
    # `train` extra is installed: those imports are the trainer's, checked on its own entry.
    laptop = entry in {"__main__.py", "infra/__main__.py"}
    optional = TRAINER_COMMANDS | LOCK_WRITER if laptop else frozenset()
    assert missing_distributions(REPO / entry, REPO / requirements, optional) == {}


def test_the_trainer_commands_of_the_command_line_need_torch():
    # What the exception above leaves out does need the train extra: were it torch-free,
    # the exception would hide nothing and should go.
    assert "torch" in third_party_imports(REPO / "infra/__main__.py")
    assert "torch" not in third_party_imports(REPO / "infra/__main__.py", TRAINER_COMMANDS)


def test_the_check_sees_a_missing_distribution(tmp_path):
    program = tmp_path / "__main__.py"
    program.write_text("import pulumi\nfrom pydantic import BaseModel\nimport json\n")
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("pulumi==3.272.0\n")
    assert missing_distributions(program, requirements) == {"pydantic": ["pydantic"]}
