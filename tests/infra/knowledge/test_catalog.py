"""infra/knowledge/data/*.toml load; each bad entry fails in one line naming entry and field."""

import datetime
import shutil
from pathlib import Path

import pytest

from infra.errors import ConfigError
from infra.knowledge.catalog import CATALOG_DIR, load_catalog
from tests.support.infra import modified_catalog

REQUIRED_TYPES = {
    "p3.2xlarge",
    "p3.8xlarge",
    "g4dn.xlarge",
    "g5.xlarge",
    "g5.12xlarge",
    "g6e.xlarge",
    "g6e.12xlarge",
    "p4d.24xlarge",
    "p4de.24xlarge",
    "p5.48xlarge",
    "p5en.48xlarge",
}


def load_error(directory: Path) -> str:
    with pytest.raises(ConfigError) as caught:
        load_catalog(directory)
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_real_catalog_has_the_required_instances_with_known_facts():
    catalog = load_catalog()
    assert set(catalog.instances) >= REQUIRED_TYPES
    p4d = catalog.instance("p4d.24xlarge")
    assert (p4d.gpu_model, p4d.gpu_count, p4d.gpu_memory_gib) == ("A100", 8, 40)
    assert (p4d.compute_capability, p4d.efa_interfaces, p4d.instance_store_nvme) == ("8.0", 4, 8)
    assert catalog.instance("p5.48xlarge").network_cards == 32
    assert catalog.instance("p5en.48xlarge").efa_interfaces == 16
    assert catalog.instance("g6e.12xlarge").efa_interfaces == 1
    assert catalog.instance("g6e.xlarge").compute_capability == "8.9"
    assert catalog.instance("p3.2xlarge").total_gpu_memory_gib == 16
    for instance in catalog.instances.values():
        assert instance.sources.hardware


def test_real_amis_root_device_follows_the_os_and_p5_family_has_efa_only_secondaries():
    catalog = load_catalog()
    for ami in catalog.amis:
        expected = "/dev/sda1" if ami.os.startswith("Ubuntu") else "/dev/xvda"
        assert ami.root_device_name == expected, ami.name
        assert ami.sources.root_device_name
    efa_only = {t for t, i in catalog.instances.items() if i.efa_secondary_interface == "efa-only"}
    assert efa_only == {"p5.48xlarge", "p5e.48xlarge", "p5en.48xlarge"}


def test_real_amis_oss_drivers_need_turing_and_al2_is_past_end_of_life():
    amis = {ami.name: ami for ami in load_catalog().amis}
    assert set(amis) == {
        "dlami-base-oss-al2023",
        "dlami-base-oss-ubuntu22",
        "dlami-base-proprietary-al2",
    }
    for name in ("dlami-base-oss-al2023", "dlami-base-oss-ubuntu22"):
        assert amis[name].driver_kind == "open"
        assert not amis[name].supports("7.0") and amis[name].supports("7.5")
        assert amis[name].ssm_parameter.startswith("/aws/service/deeplearning/ami/x86_64/base-oss")
    al2 = amis["dlami-base-proprietary-al2"]
    assert al2.supports("7.0") and al2.driver_version == "570.195.03"
    assert al2.past_end_of_life(datetime.date(2026, 11, 30))
    assert not al2.past_end_of_life(datetime.date(2026, 6, 30))
    assert al2.runs_driver("570.26") and not al2.runs_driver("580.65.06")


def test_unknown_instance_type_lists_the_known_ones():
    with pytest.raises(ConfigError, match=r"unknown instance type 'p9\.huge'.*p4d\.24xlarge"):
        load_catalog().instance("p9.huge")


INSTANCES_P3 = '[instance."p3.2xlarge"]\ngpu_model = "V100"'
BAD_CATALOGS = [
    pytest.param(
        "instances.toml",
        "gpu_count = 1",
        "gpu_count = true",
        ["instance 'p3.2xlarge'", "field 'gpu_count'", "valid integer"],
        id="count-as-flag",
    ),
    pytest.param(
        "instances.toml",
        INSTANCES_P3,
        INSTANCES_P3 + '\ngpu_modle = "V100"',
        ["instance 'p3.2xlarge'", "field 'gpu_modle'", "unknown key", "gpu_model"],
        id="unknown-key",
    ),
    pytest.param(
        "instances.toml",
        'compute_capability = "7.0"',
        'compute_capability = "sm_70"',
        ["instance 'p3.2xlarge'", "field 'compute_capability'", "sm_70"],
        id="bad-compute-capability",
    ),
    pytest.param(
        "instances.toml",
        "gpu_count = 1",
        "gpu_count = 0",
        ["instance 'p3.2xlarge'", "field 'gpu_count'"],
        id="no-gpu",
    ),
    pytest.param(
        "instances.toml",
        "efa_interfaces = 0",
        "efa_interfaces = 2",
        ["instance 'p3.2xlarge'", "field 'efa_interfaces'", "network_cards 1"],
        id="more-efa-than-network-cards",
    ),
    pytest.param(
        "instances.toml",
        "vcpus = 8\n",
        "",
        ["instance 'p3.2xlarge'", "field 'vcpus'", "missing"],
        id="missing-field",
    ),
    pytest.param(
        "instances.toml",
        'hardware = "AWS EC2 accelerated computing instance table (P3)',
        'hardwre = "x"\nhardware = "AWS EC2 accelerated computing instance table (P3)',
        ["instance 'p3.2xlarge'", "field 'sources.hardwre'", "unknown key"],
        id="unknown-source-key",
    ),
    pytest.param(
        "instances.toml",
        '[instance."p3.2xlarge"]',
        'regoin = "x"\n[instance."p3.2xlarge"]',
        ["unknown key 'regoin'"],
        id="unknown-top-level-key",
    ),
    pytest.param(
        "amis.toml",
        'driver_version = "570.195.03"',
        'driver_version = "570.x"',
        ["ami 'dlami-base-proprietary-al2'", "field 'driver_version'", "570.x"],
        id="bad-driver-version",
    ),
    pytest.param(
        "amis.toml",
        'driver_kind = "open"',
        'driver_kind = "nouveau"',
        ["ami 'dlami-base-oss-al2023'", "field 'driver_kind'", "nouveau"],
        id="unknown-driver-kind",
    ),
    pytest.param(
        "amis.toml",
        "end_of_life = 2029-06-30",
        'end_of_life = "soon"',
        ["ami 'dlami-base-oss-al2023'", "field 'end_of_life'", "soon"],
        id="end-of-life-not-a-date",
    ),
    pytest.param(
        "amis.toml",
        'ssm_parameter = "/aws/service/deeplearning',
        'ssm_parameter = "ami-0123/aws/service/deeplearning',
        ["ami 'dlami-base-oss-al2023'", "field 'ssm_parameter'"],
        id="ssm-parameter-not-public-path",
    ),
    pytest.param(
        "amis.toml",
        'root_device_name = "/dev/sda1"',
        'root_device_name = "sda1"',
        ["ami 'dlami-base-oss-ubuntu22'", "field 'root_device_name'", "/dev/xvda"],
        id="root-device-not-a-device-name",
    ),
    pytest.param(
        "amis.toml",
        'root_device_name = "/dev/xvda"\n',
        "",
        ["ami 'dlami-base-oss-al2023'", "field 'root_device_name'", "missing"],
        id="root-device-missing",
    ),
    pytest.param(
        "instances.toml",
        'efa_secondary_interface = "efa-only"',
        'efa_secondary_interface = "srd"',
        ["instance 'p5.48xlarge'", "field 'efa_secondary_interface'", "srd"],
        id="unknown-efa-interface-kind",
    ),
    pytest.param(
        "instances.toml",
        "instance_store_gb = 0\n",
        'instance_store_gb = 0\nefa_secondary_interface = "efa-only"\n',
        ["instance 'p3.2xlarge'", "field 'efa_secondary_interface'", "efa_interfaces is 0"],
        id="efa-only-without-efa",
    ),
    pytest.param(
        "amis.toml",
        "[ami.dlami-base-oss-al2023]",
        "[ami.dlami-base-oss-al2023\n",
        ["amis.toml", "not valid TOML"],
        id="bad-toml",
    ),
]


@pytest.mark.parametrize(("file", "old", "new", "expected"), BAD_CATALOGS)
def test_bad_catalog_is_rejected_naming_entry_and_field(tmp_path, file, old, new, expected):
    message = load_error(modified_catalog(tmp_path, file, old, new))
    for part in expected:
        assert part in message


def test_missing_catalog_file(tmp_path):
    shutil.copy(CATALOG_DIR / "instances.toml", tmp_path / "instances.toml")
    assert "amis.toml: file not found" in load_error(tmp_path)
