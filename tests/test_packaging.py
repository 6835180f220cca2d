"""pyproject.toml: the declared dependencies and the `gpu-stack` console script.

The pins in pyproject.toml and in requirements*.txt are the same facts written for two
installers (pip -r for a clone and CI, `pip install ".[infra]"` for a user); the first
test keeps them equal. The second installs the wheel the way a user does, into a fresh
virtualenv, and runs the installed script from inside a clone, as a user would.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def _pins(lines: list[str]) -> dict[str, str]:
    pins = {}
    for line in lines:
        line = line.split("#")[0].split(";")[0].rstrip("\\ ").strip()
        if line and not line.startswith("-r") and "==" in line:
            name, version = line.split("==")
            pins[re.sub(r"\[.*\]", "", name).lower()] = version
    return pins


def _file_pins(name: str) -> dict[str, str]:
    return _pins((REPO / name).read_text().splitlines())


@pytest.mark.parametrize(
    ("extra", "requirements"),
    [
        ("infra", "requirements.txt"),  # the command line and the Pulumi program
        ("train", "requirements-train.txt"),  # the trainer outside an image
    ],
)
def test_base_and_extra_pin_what_the_requirements_file_pins(extra, requirements):
    declared = _pins(PYPROJECT["dependencies"]) | _pins(PYPROJECT["optional-dependencies"][extra])
    assert declared == _file_pins(requirements)


def test_the_dev_extra_pins_what_requirements_dev_adds():
    dev = PYPROJECT["optional-dependencies"]["dev"]
    assert "gpu-training-stack[infra,train]" in dev
    assert _pins(dev) == _file_pins("requirements-dev.txt")


def test_the_base_holds_only_what_the_image_lock_has_too():
    # The image installs the wheel without dependencies and then runs `pip check`, which
    # fails on any base dependency its lock lacks (images/Dockerfile).
    for variant in ("cpu", "cu128", "cu130"):
        lock = _file_pins(f"images/locks/{variant}.txt")
        for name, version in _pins(PYPROJECT["dependencies"]).items():
            assert lock.get(name) == version, (variant, name)


@pytest.fixture(scope="module")
def installed_script(tmp_path_factory) -> Path:
    """`pip install .` into a fresh virtualenv; the script's path.

    The dependencies come from this test's own environment through PYTHONPATH (no index
    is reachable), which processes no .pth file: the project's editable install here
    stays out, so every project module comes from the installed wheel.
    """
    root = tmp_path_factory.mktemp("install")
    source = root / "source"
    source.mkdir()
    shutil.copy(REPO / "pyproject.toml", source)
    for package in ("common", "images", "infra", "training"):
        shutil.copytree(
            REPO / package, source / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--no-index", "--quiet", "--wheel-dir", str(root / "dist"), str(source)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert build.returncode == 0, build.stderr
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    install = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
         "--no-index", "--quiet", *map(str, (root / "dist").glob("*.whl"))],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert install.returncode == 0, install.stderr
    return venv / "bin" / "gpu-stack"


def _run(script: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    site_packages = next(p for p in sys.path if p.endswith("site-packages"))
    env = {**os.environ, "PYTHONPATH": site_packages}
    return subprocess.run(
        [str(script), *args], cwd=cwd, env=env, capture_output=True, text=True, check=False
    )


def test_the_installed_script_lists_the_stack_and_trainer_commands(installed_script, tmp_path):
    result = _run(installed_script, "--help", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: gpu-stack ")
    for command in ("offers", "plan", "up", "status", "down", "train", "estimate", "export"):
        assert re.search(rf"^\s+{command}\s", result.stdout, re.MULTILINE), command


def test_the_installed_script_plans_a_stack_from_inside_a_clone(installed_script):
    # From a subfolder, as the Pulumi CLI finds Pulumi.yaml in a parent folder.
    result = _run(installed_script, "plan", "a100x8", cwd=REPO / "docs")
    assert result.returncode == 0, result.stderr
    assert "p4d.24xlarge" in result.stdout
    # The modules are the installed wheel's, not this checkout's.
    where = subprocess.run(
        [str(installed_script.parent / "python"), "-c", "import infra; print(infra.__file__)"],
        capture_output=True, text=True, check=True, cwd=installed_script.parent,
        env={**os.environ, "PYTHONPATH": ""},
    )  # fmt: skip
    assert Path(where.stdout.strip()).is_relative_to(installed_script.parents[1])


def test_outside_a_clone_the_script_plans_a_profile_from_its_own_data(installed_script, tmp_path):
    # No stack file here: `plan` resolves the profile from the catalog, prices and image
    # matrix the wheel carries as package data.
    result = _run(installed_script, "plan", "a100x8", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "p4d.24xlarge" in result.stdout
    assert "gpu:trainConfig" not in result.stdout


@pytest.mark.slow(
    reason="installs the project into a new virtualenv and runs the installed script", seconds=70
)
def test_the_installed_script_runs_the_trainers_estimate(installed_script):
    result = _run(
        installed_script, "estimate", "--set", "model.preset=gpt-124m", "--gpus", "1",
        "--gpu-type", "A100-40GB", cwd=REPO,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "GiB" in result.stdout


def test_the_installed_script_is_quiet_when_its_reader_goes_away(installed_script, tmp_path):
    site_packages = next(p for p in sys.path if p.endswith("site-packages"))
    result = subprocess.run(
        # `true` has exited before the script's first write: that write finds no reader.
        f"'{installed_script}' offers | true; echo $((PIPESTATUS[0]))",
        shell=True, executable="bash", cwd=tmp_path, capture_output=True, text=True, check=False,
        env={**os.environ, "PYTHONPATH": site_packages},
    )  # fmt: skip
    assert result.stdout.strip() == "141"  # 128 + SIGPIPE, as a shell reports it
    assert result.stderr == ""
