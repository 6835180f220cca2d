import os
from pathlib import Path

import pytest

from images import builder, locks
from images.build_args import DOCKERFILE, IMAGE_NAME, REPO_ROOT
from images.errors import CannotRun, RunFailed
from images.matrix import load_matrix

MATRIX = load_matrix()
CPU = MATRIX.variant("cpu")
CUDA = next(v for v in MATRIX.variants if v.cuda)


def request(variant=CPU, **options):
    return builder.make_request(
        MATRIX, variant, revision="r1", created="c1", source_url="s1", **options
    )


def pairs(argv, flag):
    return [argv[i + 1] for i, arg in enumerate(argv) if arg == flag]


def test_docker_loads_one_local_tag_with_every_build_arg():
    req = request(CUDA)
    argv = builder.docker_argv(req)
    assert argv[:3] == ["docker", "buildx", "build"]
    assert argv[-2:] == ["--load", str(REPO_ROOT)]
    assert pairs(argv, "--file") == [str(DOCKERFILE)]
    assert pairs(argv, "--target") == ["runtime"]
    assert pairs(argv, "--tag") == [f"{IMAGE_NAME}:{CUDA.tag(MATRIX.release)}"]
    args = dict(item.split("=", 1) for item in pairs(argv, "--build-arg"))
    assert args["BASE_BUILD"] == CUDA.base_build
    assert args["TORCH_INDEX_URL"] == ""  # PyPI's default torch is this variant's build
    assert "CA_BUNDLE" not in args
    assert "--cache-from" not in argv


def test_docker_builds_locally_even_when_pushing_and_uses_the_registry_cache():
    req = request(
        CUDA,
        registries=("ghcr.io/org", "123.dkr.ecr.us-east-1.amazonaws.com/"),
        cache="ghcr.io/org/cache:cu",
        cache_write=True,
    )
    argv = builder.docker_argv(req)
    tag = CUDA.tag(MATRIX.release)
    # The build never pushes: the image goes to the local store, is smoke-tested there,
    # and that image is pushed afterwards.
    assert pairs(argv, "--tag") == [f"{IMAGE_NAME}:{tag}"]
    assert "--load" in argv and "--push" not in argv
    assert pairs(argv, "--cache-from") == ["type=registry,ref=ghcr.io/org/cache:cu"]
    assert pairs(argv, "--cache-to") == ["type=registry,ref=ghcr.io/org/cache:cu,mode=max"]


def test_push_tags_the_tested_local_image_for_each_registry(tmp_path):
    req = request(CUDA, registries=("ghcr.io/org", "123.dkr.ecr.us-east-1.amazonaws.com/"))
    tag = CUDA.tag(MATRIX.release)
    local = f"{IMAGE_NAME}:{tag}"
    assert builder.push_argvs(req, "docker", tmp_path) == [
        ["docker", "tag", local, f"ghcr.io/org/{IMAGE_NAME}:{tag}"],
        ["docker", "push", f"ghcr.io/org/{IMAGE_NAME}:{tag}"],
        ["docker", "tag", local, f"123.dkr.ecr.us-east-1.amazonaws.com/{IMAGE_NAME}:{tag}"],
        ["docker", "push", f"123.dkr.ecr.us-east-1.amazonaws.com/{IMAGE_NAME}:{tag}"],
    ]


def test_push_reports_each_registry_digest(tmp_path, monkeypatch):
    req = request(registries=("ghcr.io/org", "ecr.example/x"), storage_driver="vfs")
    tag = CPU.tag(MATRIX.release)
    # A stand-in buildah that, like the real one, writes each pushed digest to --digestfile.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "buildah"
    fake.write_text(
        "#!/bin/sh\n"
        'echo "$*" >> "$0.log"\n'
        'while [ $# -gt 0 ]; do [ "$1" = --digestfile ] && echo sha256:ab$(basename "$2") > "$2"; '
        "shift; done\n"
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    assert builder.push(req, "buildah") == [
        f"ghcr.io/org/{IMAGE_NAME}@sha256:ab0",
        f"ecr.example/x/{IMAGE_NAME}@sha256:ab1",
    ]
    calls = (bin_dir / "buildah.log").read_text().splitlines()
    assert calls[0] == f"--storage-driver vfs tag {IMAGE_NAME}:{tag} ghcr.io/org/{IMAGE_NAME}:{tag}"
    assert calls[1].startswith("--storage-driver vfs push --digestfile ")
    assert len(calls) == 4 and not any(" bud " in f" {c} " for c in calls)


def test_docker_reads_a_cache_without_writing_it_unless_asked():
    argv = builder.docker_argv(request(CUDA, cache="ghcr.io/org/cache:cu"))
    assert pairs(argv, "--cache-from") == ["type=registry,ref=ghcr.io/org/cache:cu"]
    assert "--cache-to" not in argv


def test_only_a_torch_build_off_pypi_brings_its_index():
    cu130 = MATRIX.variant("cu130")
    args = dict(
        item.split("=", 1) for item in pairs(builder.docker_argv(request(cu130)), "--build-arg")
    )
    assert args["TORCH_INDEX_URL"] == ""  # committed lock: PyPI's torch==2.13.0, the cu130 build
    # The cpu lock pins torch==2.13.0+cpu, which only PyTorch's cpu index serves.
    args = dict(
        item.split("=", 1) for item in pairs(builder.docker_argv(request(CPU)), "--build-arg")
    )
    assert args["TORCH_INDEX_URL"] == CPU.torch_index == "https://download.pytorch.org/whl/cpu"


def test_wheelhouse_is_a_build_context_and_replaces_the_torch_index(tmp_path):
    for argv in (
        builder.docker_argv(request(wheelhouse=tmp_path)),
        builder.buildah_argv(request(wheelhouse=tmp_path)),
    ):
        assert pairs(argv, "--build-context") == [f"wheelhouse={tmp_path}"]
        args = dict(item.split("=", 1) for item in pairs(argv, "--build-arg"))
        assert args["TORCH_INDEX_URL"] == ""


def test_buildah_uses_chroot_host_network_docker_format_and_mounts_the_ca_bundle(tmp_path):
    bundle = tmp_path / "ca.crt"
    argv = builder.buildah_argv(request(ca_bundle=bundle, storage_driver="vfs"))
    assert argv[:4] == ["buildah", "--storage-driver", "vfs", "bud"]
    assert pairs(argv, "--isolation") == ["chroot"]
    assert pairs(argv, "--network") == ["host"]
    assert pairs(argv, "--format") == ["docker"]
    assert pairs(argv, "--volume") == [f"{bundle}:{builder.CA_BUNDLE_IN_BUILD}:ro"]
    args = dict(item.split("=", 1) for item in pairs(argv, "--build-arg"))
    assert args["CA_BUNDLE"] == builder.CA_BUNDLE_IN_BUILD
    assert argv[-1] == str(REPO_ROOT)


def test_podman_gets_the_same_flags_under_its_own_verb():
    argv = builder.buildah_argv(request(), engine="podman")
    assert argv[:2] == ["podman", "build"]
    assert argv[2:] == builder.buildah_argv(request())[2:]


def test_ca_bundle_is_refused_for_docker_with_a_reason(tmp_path):
    with pytest.raises(CannotRun, match="--ca-bundle is for buildah"):
        builder.docker_argv(request(ca_bundle=tmp_path / "ca.crt"))


def _fake_tools(tmp_path: Path, docker_exit: int | None, others=("buildah",)) -> str:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tools = {name: 0 for name in others}
    if docker_exit is not None:
        tools["docker"] = docker_exit
    for name, code in tools.items():
        tool = bin_dir / name
        tool.write_text(f"#!/bin/sh\nexit {code}\n")
        tool.chmod(0o755)
    return str(bin_dir)


@pytest.mark.parametrize(
    ("docker_exit", "others", "engine"),
    [
        (0, ("buildah",), "docker"),
        (1, ("buildah",), "buildah"),
        (None, ("buildah",), "buildah"),
        (1, ("podman",), "podman"),
    ],
)
def test_engine_is_docker_only_when_docker_info_succeeds(
    tmp_path, monkeypatch, docker_exit, others, engine
):
    monkeypatch.setenv("PATH", _fake_tools(tmp_path, docker_exit, others))
    assert builder.detect_engine() == engine


def test_no_engine_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", _fake_tools(tmp_path, 1, others=()))
    with pytest.raises(CannotRun, match="apt-get install buildah"):
        builder.detect_engine()


def test_a_lock_that_is_not_the_matrix_is_refused_before_building(tmp_path, monkeypatch):
    text = locks.lock_path(CPU).read_text()
    (tmp_path / "cpu.txt").write_text(text.replace("numpy==", "numpy==0.0.0\nunused==", 1))
    monkeypatch.setattr(locks, "LOCKS_DIR", tmp_path)
    monkeypatch.setattr(locks, "REPO_ROOT", tmp_path)
    with pytest.raises(locks.LockError, match=r"pins without a hash: numpy==0\.0\.0"):
        request(CPU)


def test_failed_engine_run_raises_build_failed(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", _fake_tools(tmp_path, None, others=()) + os.pathsep + "/usr/bin")
    failing = tmp_path / "bin" / "buildah"
    failing.write_text("#!/bin/sh\nexit 3\n")
    failing.chmod(0o755)
    with pytest.raises(RunFailed, match="failed for variant 'cpu'"):
        builder.build(request(), engine="buildah")


def test_image_name_names_the_repository_in_every_registry(tmp_path):
    req = request(
        CUDA,
        registries=("123.dkr.ecr.us-east-1.amazonaws.com",),
        image_name="mystack-images-1a2b3c",
    )
    tag = CUDA.tag(MATRIX.release)
    assert req.tags == (f"123.dkr.ecr.us-east-1.amazonaws.com/mystack-images-1a2b3c:{tag}",)
    assert pairs(builder.docker_argv(req), "--tag") == [f"mystack-images-1a2b3c:{tag}"]
    assert pairs(builder.docker_argv(request(image_name="local")), "--tag") == [
        f"local:{CPU.tag(MATRIX.release)}"
    ]


def test_offline_build_turns_every_index_off(tmp_path):
    argv = builder.buildah_argv(request(wheelhouse=tmp_path, offline=True))
    args = dict(item.split("=", 1) for item in pairs(argv, "--build-arg"))
    assert args["PYPI_INDEX_URL"] == "" and args["TORCH_INDEX_URL"] == ""
    online = builder.buildah_argv(request(wheelhouse=tmp_path))
    assert "PYPI_INDEX_URL" not in dict(item.split("=", 1) for item in pairs(online, "--build-arg"))


def test_offline_without_a_wheelhouse_is_refused():
    with pytest.raises(CannotRun, match="--offline needs --wheelhouse DIR"):
        request(offline=True)


def test_buildah_keeps_layers_when_the_image_is_pushed():
    assert "--layers" not in builder.buildah_argv(request())  # local smoke build: one layer
    pushed = builder.buildah_argv(request(registries=("ghcr.io/org",)))
    assert "--layers" in pushed
    assert pairs(pushed, "--tag") == [f"{IMAGE_NAME}:{CPU.tag(MATRIX.release)}"]


def test_a_staged_build_pushes_once_with_its_sbom_and_provenance(tmp_path):
    req = request(CUDA, cache="ghcr.io/org/cache:cu")
    staging = f"ghcr.io/org/{IMAGE_NAME}-staging:{CUDA.tag(MATRIX.release)}-41"
    argv = builder.stage_argv(req, staging, tmp_path / "metadata.json")
    assert pairs(argv, "--tag") == [staging]  # the staging tag only, never the release's
    assert argv[-2:] == ["--push", str(REPO_ROOT)] and "--load" not in argv
    assert {"--sbom=true", "--provenance=mode=max"} <= set(argv)
    assert pairs(argv, "--metadata-file") == [str(tmp_path / "metadata.json")]
    assert pairs(argv, "--cache-from") == ["type=registry,ref=ghcr.io/org/cache:cu"]


def test_stage_reports_the_digest_buildx_pushed(tmp_path, monkeypatch):
    digest = "sha256:" + "ab" * 32

    def fake_run(argv, variant):
        metadata = Path(argv[argv.index("--metadata-file") + 1])
        metadata.write_text(f'{{"containerimage.digest": "{digest}"}}')

    monkeypatch.setattr(builder, "_run", fake_run)
    staged = builder.stage(request(CUDA), "ghcr.io/org/x-staging:t-1")
    assert staged == f"ghcr.io/org/x-staging@{digest}"
