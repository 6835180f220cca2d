import json
import os
import subprocess
import sys

import pytest

from images import locks
from images.__main__ import main
from images.build_args import IMAGE_NAME, REPO_ROOT
from images.matrix import load_matrix

MATRIX = load_matrix()


def test_unknown_variant_is_one_line_and_exit_2(capsys):
    assert main(["build-args", "cu999"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "cu999" in err
    assert len(err.strip().splitlines()) == 1


def test_build_args_prints_every_arg_from_the_matrix(capsys):
    variant = MATRIX.variants[-1]
    assert main(["build-args", variant.name]) == 0
    printed = dict(line.split("=", 1) for line in capsys.readouterr().out.splitlines())
    assert printed["BASE_RUNTIME"] == variant.base_runtime
    assert printed["IMAGE_VERSION"] == variant.tag(MATRIX.release)


def test_build_dry_run_prints_the_buildah_commands(capsys, tmp_path):
    args = [
        "build",
        "cpu",
        "--engine",
        "buildah",
        "--storage-driver",
        "vfs",
        "--dry-run",
        "--push",
        "registry.example/team",
        "--wheelhouse",
        str(tmp_path),
    ]
    assert main(args) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("buildah --storage-driver vfs bud ")
    assert f"--build-context wheelhouse={tmp_path}" in lines[0]
    tag = MATRIX.variant("cpu").tag(MATRIX.release)
    remote = f"registry.example/team/{IMAGE_NAME}:{tag}"
    # The pushed image is the built one: tagged from the local name, never rebuilt.
    assert lines[1:] == [
        f"buildah --storage-driver vfs tag {IMAGE_NAME}:{tag} {remote}",
        f"buildah --storage-driver vfs push --digestfile DIGESTS/0 {remote}",
    ]


def _tool(bin_dir, name: str, exit_code: int) -> None:
    tool = bin_dir / name
    tool.write_text(f"#!/bin/sh\nexit {exit_code}\n")
    tool.chmod(0o755)


def test_a_build_that_cannot_run_exits_2_and_one_that_fails_exits_1(capsys, tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _tool(bin_dir, "buildah", 3)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    bundle = tmp_path / "ca.crt"
    bundle.write_text("")
    # An option Docker cannot take: nothing runs, exit 2.
    assert main(["build", "cpu", "--engine", "docker", "--ca-bundle", str(bundle)]) == 2
    assert "--ca-bundle is for buildah builds" in capsys.readouterr().err
    # buildah runs and exits 3: exit 1.
    assert main(["build", "cpu", "--engine", "buildah"]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[-1] == "error: buildah bud --format... failed for variant 'cpu'"


def test_missing_wheelhouse_is_a_usage_error():
    result = subprocess.run(
        [sys.executable, "-m", "images", "build", "cpu", "--wheelhouse", "/nonexistent/wheels"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2
    assert "'/nonexistent/wheels' is not a directory" in result.stderr


def test_ci_matrix_prints_one_json_line_for_the_workflow():
    result = subprocess.run(
        [sys.executable, "-m", "images", "ci-matrix"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.splitlines()) == 1  # one $GITHUB_OUTPUT line
    assert [e["variant"] for e in json.loads(result.stdout)["include"]] == ["cpu", "cu128", "cu130"]


def test_cache_write_without_a_cache_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["build", "cpu", "--cache-write", "--dry-run"])
    assert exit_info.value.code == 2
    assert "--cache-write needs --cache REF" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["stage", "cu130", "ghcr.io/acme", "--run", "1", "--cache-write"])
    assert "--cache-write needs --cache REF" in capsys.readouterr().err


def test_the_disk_budget_counts_a_cache_export_without_a_cache_ref(monkeypatch):
    from images import disk_budget

    called = {}
    monkeypatch.setattr(
        disk_budget, "main", lambda matrix, variant, paths, **options: called.update(options) or 0
    )
    assert main(["disk-budget", "cu130", "--cache-write"]) == 0
    assert called == {"cache_write": True, "peak_log": None}


def test_lock_whose_torch_is_nowhere_reachable_is_one_line_and_exit_2(capsys, monkeypatch):
    monkeypatch.setattr(locks, "index_reachable", lambda url: False)
    assert main(["lock", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: torch==2.13.0+cpu is not reachable")
    assert len(err.strip().splitlines()) == 1
