"""The node setup script's compute role, run in a temporary root: Enroot's configuration.

How Enroot reads its configuration (NVIDIA/enroot enroot.in, config::load, config::init and
config::export, commit 8ea147d337da60cb1c557140f3a85cdf0d620968): each line of enroot.conf,
then of enroot.conf.d/*.conf, is split into a key and a value at the first spaces, tabs or
`=`; only keys such as ENROOT_* count; the first value read for a key is kept. It reads the
registry credentials from `$ENROOT_CONFIG_PATH/.credentials` (enroot doc/cmd/import.md,
"Credentials"), and creates each user's cache, data and runtime folders with umask 077.
"""

from __future__ import annotations

import re
import stat
import subprocess
from pathlib import Path

import pytest

from infra.cluster.config import SETUP_SCRIPT

REGISTRY = "123456789012.dkr.ecr.us-east-1.amazonaws.com"
# The example configuration a ParallelCluster AMI ships, in the shape of
# aws-parallelcluster-cookbook's enroot template (files/enroot/enroot.template.conf):
# its own runtime, config, cache and data paths are active lines.
EXAMPLE = """\
#ENROOT_LIBRARY_PATH        /usr/lib/enroot
ENROOT_RUNTIME_PATH        /tmp/enroot/user-$(id -u)
ENROOT_CONFIG_PATH         ${HOME}/.config/enroot
ENROOT_CACHE_PATH          /var/enroot/cache/group-$(id -g)
ENROOT_DATA_PATH           /tmp/enroot/data/user-$(id -u)
ENROOT_SQUASH_OPTIONS -noI -noD -noF -noX -no-duplicates
ENROOT_ROOTFS_WRITABLE     yes
ENROOT_MOUNT_HOME          no
"""
_LINE = re.compile(r"^[ \t=]*([^ \t=]+)[ \t=]*(.*)$")
_KEY = re.compile(r"^ENROOT_[A-Z_]+$")


def enroot_settings(text: str) -> list[tuple[str, str]]:
    """(key, raw value) of each line Enroot takes from a configuration file, in order."""
    found = []
    for line in text.splitlines():
        match = _LINE.match(line)
        if match and _KEY.match(match.group(1)):
            found.append((match.group(1), match.group(2)))
    return found


@pytest.fixture
def node(tmp_path: Path) -> Path:
    (tmp_path / "opt/parallelcluster/examples/enroot").mkdir(parents=True)
    (tmp_path / "opt/parallelcluster/examples/enroot/enroot.conf").write_text(EXAMPLE)
    (tmp_path / "etc/enroot").mkdir(parents=True)
    result = subprocess.run(
        ["bash", str(SETUP_SCRIPT), "compute", REGISTRY, "us-east-1"],
        env={"SETUP_NODE_ROOT": str(tmp_path), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    return tmp_path


def test_each_enroot_setting_has_one_value_whatever_the_reading_order(node):
    settings = enroot_settings((node / "etc/enroot/enroot.conf").read_text())
    first, last = {}, {}
    for key, value in settings:
        first.setdefault(key, value)
        last[key] = value
    assert first == last
    assert first["ENROOT_CONFIG_PATH"] == "/etc/enroot"
    assert first["ENROOT_RUNTIME_PATH"] == "/run/enroot/user-$(id -u)"
    assert first["ENROOT_CACHE_PATH"] == "/scratch/enroot/cache/group-$(id -g)"
    assert first["ENROOT_DATA_PATH"] == "/scratch/enroot/data/user-$(id -u)"
    # The example's other settings stay.
    assert first["ENROOT_ROOTFS_WRITABLE"] == "yes"
    assert first["ENROOT_SQUASH_OPTIONS"] == "-noI -noD -noF -noX -no-duplicates"


def test_the_credentials_file_is_where_enroot_config_path_points(node):
    credentials = node / "etc/enroot/.credentials"
    assert credentials.read_text() == (
        f"machine {REGISTRY} login AWS password $(aws ecr get-login-password --region us-east-1)\n"
    )
    assert stat.S_IMODE(credentials.stat().st_mode) == 0o644


@pytest.mark.parametrize("folder", ["run/enroot", "scratch/enroot/cache", "scratch/enroot/data"])
def test_every_user_can_make_its_own_enroot_folders(node, folder):
    # Enroot makes user-<uid> / group-<gid> below these with umask 077: sticky and
    # world-writable parents, as /tmp.
    assert stat.S_IMODE((node / folder).stat().st_mode) == 0o1777
