"""The node setup script, run in a temporary root with the arguments the cluster config gives
it: Enroot's configuration and credentials, the GPU hook's tool, Pyxis, the Epilog.

How Enroot reads its configuration (NVIDIA/enroot enroot.in, config::load, config::init and
config::export, commit 8ea147d337da60cb1c557140f3a85cdf0d620968): each line of enroot.conf,
then of enroot.conf.d/*.conf, is split into a key and a value at the first spaces, tabs or
`=`; only keys such as ENROOT_* count; the first value read for a key is kept. It reads the
registry credentials from `$ENROOT_CONFIG_PATH/.credentials` (enroot doc/cmd/import.md,
"Credentials", netrc format: `machine HOST login USER password ...`), and creates each
user's cache, data and runtime folders with umask 077.

Enroot and Pyxis do not install here (neither is packaged for Debian): the image URI the job
script passes is checked against Enroot's documented grammar instead, and the tools the
script calls on a node (aws, apt-get, systemctl, nvidia-container-cli) are stand-ins on PATH
that record what they were asked.
"""

from __future__ import annotations

import re
import shlex
import stat
import subprocess
from pathlib import Path

import pytest

from infra.cluster.config import ECR_LOGIN, SETUP_SCRIPT, cluster_config
from infra.components.cluster import job_script
from infra.knowledge.resolver import resolve
from tests.infra.cluster.test_config import PARALLELCLUSTER, settings

IMAGE_URI = f"{settings().registry}/gpu-stack-test-images:1.0-cu128"
# The example configuration a ParallelCluster AMI ships, in the shape of
# aws-parallelcluster-cookbook's enroot template (files/enroot/enroot.template.conf):
# its own runtime, config, cache and data paths are active lines.
EXAMPLE = """\
#ENROOT_LIBRARY_PATH        /usr/lib/enroot
ENROOT_RUNTIME_PATH        /tmp/enroot/user-$(id -u)
ENROOT_CONFIG_PATH         ${HOME}/.config/enroot
ENROOT_CACHE_PATH          /var/enroot/cache/group-$(id -g)
ENROOT_DATA_PATH           /tmp/enroot/data/user-$(id -u)
#ENROOT_TEMP_PATH          ${TMPDIR:-/tmp}
ENROOT_SQUASH_OPTIONS -noI -noD -noF -noX -no-duplicates
ENROOT_ROOTFS_WRITABLE     yes
ENROOT_MOUNT_HOME          no
"""
# The AMI's example Pyxis plugstack line (aws-parallelcluster-cookbook,
# aws-parallelcluster-slurm/templates/default/pyxis/pyxis.conf.erb).
PYXIS_EXAMPLE = """\
# THIS IS AN EXAMPLE OF pyxis.conf file
required /usr/local/lib/slurm/spank_pyxis.so runtime_path=/run/pyxis
"""
_LINE = re.compile(r"^[ \t=]*([^ \t=]+)[ \t=]*(.*)$")
_KEY = re.compile(r"^ENROOT_[A-Z_]+$")
# `enroot import`'s URI, past the scheme: [USER@][REGISTRY#]IMAGE[:TAG] (NVIDIA/enroot
# doc/cmd/import.md, "Usage", tag v3.4.1); an image is lower-case letters, digits, '/', '.',
# '_' and '-', a tag letters, digits, '.', '_' and '-' (Docker's reference grammar).
ENROOT_IMAGE = re.compile(
    r"(?:(?P<user>[^@#/]+)@)?(?:(?P<registry>[^@#]+)#)?(?P<image>[a-z0-9/._-]+)"
    r"(?::(?P<tag>[A-Za-z0-9._-]+))?"
)
# A netrc line Enroot takes for a registry and user: `machine REGISTRY login USER ...`.
CREDENTIALS = re.compile(r"^machine\s+(?P<machine>\S+)\s+login\s+(?P<login>\S+)\s", re.MULTILINE)


def enroot_settings(text: str) -> list[tuple[str, str]]:
    """(key, raw value) of each line Enroot takes from a configuration file, in order."""
    found = []
    for line in text.splitlines():
        match = _LINE.match(line)
        if match and _KEY.match(match.group(1)):
            found.append((match.group(1), match.group(2)))
    return found


def stand_in(folder: Path, name: str, body: str) -> None:
    """A command on PATH that records its arguments in FOLDER/NAME.calls, then runs `body`."""
    path = folder / name
    path.write_text(f'#!/bin/bash\necho "$*" >>"{folder}/{name}.calls"\n{body}\n')
    path.chmod(0o755)


def calls(folder: Path, name: str) -> list[str]:
    path = folder / f"{name}.calls"
    return path.read_text().splitlines() if path.exists() else []


def setup_args(role: str) -> list[str]:
    """What ParallelCluster passes the script on a node of `role` (OnNodeConfigured, Args)."""
    config = cluster_config(
        resolve("p4d.24xlarge", nodes=2, cluster=PARALLELCLUSTER.release()), settings()
    )
    head = config["HeadNode"]["CustomActions"]["OnNodeConfigured"]
    compute = config["Scheduling"]["SlurmQueues"][0]["CustomActions"]["OnNodeConfigured"]
    return (head if role == "head" else compute)["Args"]


def run_setup(root: Path, tools: Path, args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(SETUP_SCRIPT), *args],
        env={"SETUP_NODE_ROOT": str(root), "PATH": f"{tools}:/usr/bin:/bin"},
        capture_output=True,
        text=True,
    )


@pytest.fixture
def tools(tmp_path: Path) -> Path:
    """Stand-ins for a GPU node's commands: nvidia-container-cli installed and answering."""
    folder = tmp_path / "tools"
    folder.mkdir()
    stand_in(folder, "nvidia-container-cli", "exit 0")
    return folder


@pytest.fixture
def root(tmp_path: Path) -> Path:
    node = tmp_path / "root"
    (node / "opt/parallelcluster/examples/enroot").mkdir(parents=True)
    (node / "opt/parallelcluster/examples/enroot/enroot.conf").write_text(EXAMPLE)
    (node / "etc/enroot").mkdir(parents=True)
    return node


@pytest.fixture
def node(root: Path, tools: Path) -> Path:
    result = run_setup(root, tools, setup_args("compute"))
    assert result.returncode == 0, result.stderr
    return root


def test_each_enroot_setting_has_one_value_whatever_the_reading_order(node):
    settings_ = enroot_settings((node / "etc/enroot/enroot.conf").read_text())
    first, last = {}, {}
    for key, value in settings_:
        first.setdefault(key, value)
        last[key] = value
    assert first == last
    assert first["ENROOT_RUNTIME_PATH"] == "/run/enroot/user-$(id -u)"
    assert first["ENROOT_CACHE_PATH"] == "/scratch/enroot/cache/group-$(id -g)"
    assert first["ENROOT_DATA_PATH"] == "/scratch/enroot/data/user-$(id -u)"
    # The example's other settings stay.
    assert first["ENROOT_ROOTFS_WRITABLE"] == "yes"
    assert first["ENROOT_SQUASH_OPTIONS"] == "-noI -noD -noF -noX -no-duplicates"


def test_the_user_configuration_folder_is_not_the_system_one(node):
    """Enroot runs the hooks of ENROOT_SYSCONF_PATH (/etc/enroot) and of ENROOT_CONFIG_PATH:
    the same folder twice runs every hook twice (src/runtime.sh, hook_dirs, tag v3.4.1)."""
    first = dict(reversed(enroot_settings((node / "etc/enroot/enroot.conf").read_text())))
    config_path = first["ENROOT_CONFIG_PATH"]
    assert Path(config_path).resolve() != Path("/etc/enroot")
    assert not config_path.startswith("/etc/enroot/") and config_path == "/etc/gpu-stack/enroot"


def test_layers_unpack_on_the_scratch_disk_not_the_root_volume(node):
    first = dict(reversed(enroot_settings((node / "etc/enroot/enroot.conf").read_text())))
    assert first["ENROOT_TEMP_PATH"] == "/scratch/enroot/tmp"
    assert stat.S_IMODE((node / "scratch/enroot/tmp").stat().st_mode) == 0o1777


def test_the_image_uri_names_the_user_the_credentials_file_gives_its_registry(node):
    """The job script's --container-image, read with Enroot's URI grammar, names a user, and
    the credentials file Enroot reads ($ENROOT_CONFIG_PATH/.credentials) has a line for that
    registry with that login: Enroot sends it (src/docker.sh, docker::_authenticate)."""
    plan = resolve("p4d.24xlarge", nodes=2, cluster=PARALLELCLUSTER.release())
    script = job_script(
        plan, IMAGE_URI, "s3://bucket/checkpoints", region="us-east-1", stack_resource="p-s"
    )
    (image,) = {
        word.removeprefix("--container-image=")
        for line in script.splitlines()
        if "--container-image=" in line
        for word in shlex.split(line.rstrip().removesuffix("\\"))
        if word.startswith("--container-image=")
    }
    parsed = ENROOT_IMAGE.fullmatch(image)
    assert parsed, image
    registry, repository = IMAGE_URI.split("/", 1)
    assert (parsed["registry"], f"{parsed['image']}:{parsed['tag']}") == (registry, repository)
    assert parsed["user"] == ECR_LOGIN == "AWS"

    first = dict(reversed(enroot_settings((node / "etc/enroot/enroot.conf").read_text())))
    credentials = node / first["ENROOT_CONFIG_PATH"].lstrip("/") / ".credentials"
    entries = {(m["machine"], m["login"]) for m in CREDENTIALS.finditer(credentials.read_text())}
    assert (registry, parsed["user"]) in entries
    assert credentials.read_text().endswith(
        "password $(aws ecr get-login-password --region us-east-1)\n"
    )
    assert stat.S_IMODE(credentials.stat().st_mode) == 0o644


@pytest.mark.parametrize(
    "folder", ["run/enroot", "scratch/enroot/cache", "scratch/enroot/data", "scratch/enroot/tmp"]
)
def test_every_user_can_make_its_own_enroot_folders(node, folder):
    # Enroot makes user-<uid> / group-<gid> below these with umask 077: sticky and
    # world-writable parents, as /tmp.
    assert stat.S_IMODE((node / folder).stat().st_mode) == 0o1777


def test_every_user_may_leave_a_verdict_but_not_read_or_remove_anothers(node):
    verdicts = node / setup_args("compute")[4].lstrip("/")
    assert stat.S_IMODE(verdicts.stat().st_mode) == 0o1733


def test_a_node_with_nvidia_container_cli_installs_nothing(node, tools):
    assert calls(tools, "nvidia-container-cli") == ["info"]
    assert calls(tools, "apt-get") == []


def test_a_node_without_nvidia_container_cli_installs_the_pinned_package(root, tools):
    (tools / "nvidia-container-cli").unlink()
    stand_in(tools, "curl", "echo 'fake key'")
    stand_in(tools, "gpg", 'while [ "$1" != -o ]; do shift; done; cat >"$2"')
    # apt-get install puts the tool in place, as the package does.
    installs = (
        f'[ "$1" != install ] || printf "#!/bin/sh\\nexit 0\\n" >"{tools}/nvidia-container-cli"'
    )
    stand_in(
        tools, "apt-get", f'{installs}; chmod +x "{tools}/nvidia-container-cli" 2>/dev/null; :'
    )
    result = run_setup(root, tools, setup_args("compute"))
    assert result.returncode == 0, result.stderr
    assert calls(tools, "curl") == ["-fsSL https://nvidia.github.io/libnvidia-container/gpgkey"]
    sources = (root / "etc/apt/sources.list.d/nvidia-container-toolkit.list").read_text()
    assert sources == (
        "deb [signed-by=/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg] "
        "https://nvidia.github.io/libnvidia-container/stable/deb/$(ARCH) /\n"
    )
    assert (root / "usr/share/keyrings/nvidia-container-toolkit-keyring.gpg").read_text() == (
        "fake key\n"
    )
    update, install = calls(tools, "apt-get")
    assert update == "update -q"
    assert install.split()[-2:] == [
        "libnvidia-container-tools=1.17.8-1",
        "libnvidia-container1=1.17.8-1",
    ]


def test_a_node_whose_gpus_nvidia_container_cli_cannot_read_fails_in_one_line(root, tools):
    stand_in(
        tools,
        "nvidia-container-cli",
        "echo 'nvidia-container-cli: initialization error' >&2; exit 1",
    )
    result = run_setup(root, tools, setup_args("compute"))
    assert result.returncode == 1
    (line,) = result.stderr.splitlines()
    assert line.startswith("gpu-stack: nvidia-container-cli cannot read this node's GPUs")
    assert "Enroot cannot start the image's containers here" in line


def test_the_head_node_scopes_named_containers_to_the_job_and_installs_the_epilog(root, tools):
    examples = root / "opt/parallelcluster/examples"
    (examples / "spank").mkdir(parents=True)
    (examples / "spank/plugstack.conf").write_text("include /opt/slurm/etc/plugstack.conf.d/*\n")
    (examples / "pyxis").mkdir()
    (examples / "pyxis/pyxis.conf").write_text(PYXIS_EXAMPLE)
    # aws s3 cp --only-show-errors SRC DST: DST holds the object's name.
    stand_in(tools, "aws", 'echo "object $4" >"$5"')
    stand_in(tools, "systemctl", ":")
    args = setup_args("head")
    result = run_setup(root, tools, args)
    assert result.returncode == 0, result.stderr

    pyxis = (root / "opt/slurm/etc/plugstack.conf.d/pyxis.conf").read_text().splitlines()
    assert pyxis[-1] == (
        "required /usr/local/lib/slurm/spank_pyxis.so runtime_path=/run/pyxis container_scope=job"
    )
    epilog = root / "opt/slurm/etc/scripts/epilog.d/90-gpu-stack-node-verdicts"
    assert epilog.read_text() == f"object {args[2]}\n"
    assert stat.S_IMODE(epilog.stat().st_mode) == 0o755
    assert (root / "opt/gpu-stack/train.sbatch").read_text() == f"object {args[1]}\n"
    assert calls(tools, "systemctl") == ["restart slurmctld"]
