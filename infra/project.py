"""The Pulumi project folder: Pulumi.yaml, the stack files, the program and the policy pack.

The command line runs from a clone of this repository (`python -m infra`, or an editable
install), or as the installed `gpu-stack` script from inside such a clone. Like the Pulumi
CLI, which looks for Pulumi.yaml in the current folder and then its parents
(https://www.pulumi.com/docs/iac/concepts/projects/), the installed script finds the
project from the working directory.
"""

from __future__ import annotations

from pathlib import Path

PROJECT_FILE = "Pulumi.yaml"
# Set by `up` for the program it runs: build the stack without its GPU nodes (their image is
# not pushed yet), so nothing is billed by the hour before a job can start.
WITHOUT_NODES_ENV = "GPU_STACK_WITHOUT_NODES"
# The checkout this package was imported from: a clone run with `python -m infra`.
_SOURCE_CHECKOUT = Path(__file__).resolve().parents[1]


def find_project_root(cwd: Path | None = None) -> Path:
    """The checkout this package lives in, else the nearest folder at or above `cwd`
    holding Pulumi.yaml, else `cwd` (whose missing stack file then names the problem)."""
    if (_SOURCE_CHECKOUT / PROJECT_FILE).is_file():
        return _SOURCE_CHECKOUT
    start = (cwd or Path.cwd()).resolve()
    for folder in (start, *start.parents):
        if (folder / PROJECT_FILE).is_file():
            return folder
    return start


def project_name(root: Path | None = None) -> str:
    """The Pulumi project's name (Pulumi.yaml, `name`), what `pulumi.get_project()` returns."""
    import yaml

    return yaml.safe_load(((root or find_project_root()) / PROJECT_FILE).read_text())["name"]


def stack_resource_name(project: str, stack: str) -> str:
    """The name the program gives a stack's component, and a cluster stack its Slurm cluster."""
    return f"{project}-{stack}"
