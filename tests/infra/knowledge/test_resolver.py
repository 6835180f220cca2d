"""The resolver over every catalog instance x image variant, and its rules one by one."""

import datetime
import tomllib

import pytest

from images.matrix import load_matrix
from infra.errors import ConfigError
from infra.knowledge.catalog import CATALOG_DIR, load_catalog
from infra.knowledge.resolver import resolve
from tests.support.infra import modified_catalog

CATALOG = load_catalog()
MATRIX = load_matrix()
TODAY = datetime.date(2026, 11, 30)


def versions(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def wheels_run_on(capabilities: tuple[str, ...], gpu: str) -> bool:
    """The test's own statement of CUDA binary compatibility: same major, minor not above."""
    gpu_major, gpu_minor = versions(gpu)
    return any(
        versions(built)[0] == gpu_major and versions(built)[1] <= gpu_minor
        for built in capabilities
    )


def expected_failure(instance, variant) -> list[str] | None:
    """What the error must say for a pair that must not resolve, or None if it must resolve."""
    if variant.cuda is None:
        return ["'cpu' has no CUDA", instance.type, "'cu128'"]
    if instance.compute_capability == "7.0" and versions(variant.cuda)[0] >= 13:
        return ["CUDA 13 dropped", "sm_70", "'cu128'"]
    return None


PAIRS = [
    pytest.param(instance_type, variant.name, nodes, id=f"{instance_type}-{variant.name}-x{nodes}")
    for instance_type in CATALOG.instances
    for variant in MATRIX.variants
    for nodes in (1, 3)
]


@pytest.mark.parametrize(("instance_type", "variant_name", "nodes"), PAIRS)
def test_every_instance_and_variant_resolves_or_explains(instance_type, variant_name, nodes):
    instance = CATALOG.instance(instance_type)
    variant = MATRIX.variant(variant_name)
    failure = expected_failure(instance, variant)
    if failure is not None:
        with pytest.raises(ConfigError) as caught:
            resolve(instance_type, variant_name, nodes, catalog=CATALOG, matrix=MATRIX, today=TODAY)
        message = str(caught.value)
        assert "\n" not in message
        for part in failure:
            assert part in message
        return

    plan = resolve(instance_type, variant_name, nodes, catalog=CATALOG, matrix=MATRIX, today=TODAY)
    assert plan.instance == instance and plan.variant == variant and plan.nodes == nodes
    assert wheels_run_on(variant.compute_capabilities, instance.compute_capability)
    assert instance.compute_capability in plan.ami.compute_capabilities
    assert versions(plan.ami.driver_version) >= versions(variant.min_driver)
    price = CATALOG.prices.price("us-east-1", instance_type)  # a plan without a region's
    assert plan.price == price
    assert plan.on_demand_usd_per_hour == pytest.approx(nodes * price.on_demand_usd_per_hour)
    assert plan.spot_usd_per_hour == pytest.approx(nodes * price.spot_usd_per_hour)
    assert plan.gpus == nodes * instance.gpu_count
    tag = f"{MATRIX.release}-torch{variant.torch}-{variant.name}-py{variant.python}"
    assert plan.image_tag == tag
    # Only a Volta GPU may land on the end-of-life AMI, and then it is told so.
    if plan.ami.end_of_life < TODAY:
        assert instance.compute_capability == "7.0"
        assert any("past end of life" in warning for warning in plan.warnings)


@pytest.mark.parametrize("instance_type", list(CATALOG.instances))
def test_auto_picks_the_newest_variant_that_resolves(instance_type):
    runnable = []
    for variant in MATRIX.variants:  # oldest CUDA first
        try:
            resolve(instance_type, variant.name, catalog=CATALOG, matrix=MATRIX, today=TODAY)
        except ConfigError:
            continue
        runnable.append(variant.name)
    plan = resolve(instance_type, "auto", catalog=CATALOG, matrix=MATRIX, today=TODAY)
    assert plan.variant.name == runnable[-1]


@pytest.mark.parametrize(
    ("instance_type", "variant_name", "ami_name"),
    [
        ("p3.2xlarge", "cu128", "dlami-base-proprietary-al2"),  # newest with Volta kernels
        ("p4d.24xlarge", "cu130", "dlami-base-oss-al2023"),
        ("g6e.12xlarge", "cu130", "dlami-base-oss-al2023"),
    ],
)
def test_auto_known_answers(instance_type, variant_name, ami_name):
    plan = resolve(instance_type, catalog=CATALOG, matrix=MATRIX, today=TODAY)
    assert (plan.variant.name, plan.ami.name) == (variant_name, ami_name)


def test_volta_with_cuda13_names_cu128():
    with pytest.raises(
        ConfigError, match=r"CUDA 13 dropped V100's architecture \(sm_70\).*'cu128'"
    ):
        resolve("p3.2xlarge", "cu130", catalog=CATALOG, matrix=MATRIX, today=TODAY)


def test_l40s_sm89_runs_the_sm86_kernels_of_cu128():
    assert "8.9" not in MATRIX.variant("cu128").compute_capabilities
    plan = resolve("g6e.xlarge", "cu128", catalog=CATALOG, matrix=MATRIX, today=TODAY)
    assert plan.variant.name == "cu128"


def test_p3_plan_warns_that_amazon_linux_2_is_past_end_of_life():
    plan = resolve("p3.2xlarge", "cu128", catalog=CATALOG, matrix=MATRIX, today=TODAY)
    assert plan.ami.os == "Amazon Linux 2"
    eol = [w for w in plan.warnings if "past end of life" in w]
    assert len(eol) == 1 and "2026-06-30" in eol[0] and "Amazon Linux 2" in eol[0]


def test_a_v100_plan_says_in_one_line_that_no_supported_ami_remains():
    """The last AL2 proprietary-driver DLAMI (amis.toml: no_longer_supports) lists no P3."""
    amis = tomllib.loads((CATALOG_DIR / "amis.toml").read_text())["ami"]
    (family,) = [name for name, ami in amis.items() if "p3" in ami.get("no_longer_supports", [])]
    plan = resolve("p3.2xlarge", "cu128", catalog=CATALOG, matrix=MATRIX, today=TODAY)
    assert plan.ami.name == family
    first = plan.warnings[0]
    assert first.startswith("no AMI that AWS supports boots p3.2xlarge any more: ")
    assert "no longer lists P3" in first and "2026-06-30" in first and "\n" not in first


def test_end_of_life_is_computed_against_the_given_day():
    before = resolve(
        "p3.2xlarge", "cu128", catalog=CATALOG, matrix=MATRIX, today=datetime.date(2026, 5, 1)
    )
    assert not any("end of life" in warning for warning in before.warnings)


def test_an_ami_whose_driver_is_too_old_is_never_chosen(tmp_path):
    # AL2023 (the preferred family) now carries a 575 driver: cu130 needs 580.65.06.
    directory = modified_catalog(
        tmp_path, "amis.toml", 'driver_version = "595.91.07"', 'driver_version = "575.57.08"'
    )
    catalog = load_catalog(directory)
    cu130 = resolve("g5.xlarge", "cu130", catalog=catalog, matrix=MATRIX, today=TODAY)
    assert cu130.ami.name == "dlami-base-oss-ubuntu22"
    cu128 = resolve("g5.xlarge", "cu128", catalog=catalog, matrix=MATRIX, today=TODAY)
    assert cu128.ami.name == "dlami-base-oss-al2023"  # 575.57.08 >= 570.26: still preferred


def test_no_ami_with_a_new_enough_driver_is_an_error_that_names_what_works(tmp_path):
    directory = modified_catalog(
        tmp_path, "amis.toml", 'driver_version = "595.91.07"', 'driver_version = "575.57.08"'
    )
    text = (directory / "amis.toml").read_text().replace("595.91.07", "575.57.08")
    (directory / "amis.toml").write_text(text)
    catalog = load_catalog(directory)
    with pytest.raises(ConfigError) as caught:
        resolve("g5.xlarge", "cu130", catalog=catalog, matrix=MATRIX, today=TODAY)
    message = str(caught.value)
    assert "needs NVIDIA driver 580.65.06" in message and "575.57.08" in message
    assert "use 'cu128' (or 'auto')" in message
    auto = resolve("g5.xlarge", catalog=catalog, matrix=MATRIX, today=TODAY)
    assert auto.variant.name == "cu128"


def test_an_end_of_life_ami_loses_to_a_supported_one(tmp_path):
    directory = modified_catalog(
        tmp_path, "amis.toml", "end_of_life = 2029-06-30", "end_of_life = 2026-01-31"
    )
    plan = resolve(
        "g5.xlarge", "cu130", catalog=load_catalog(directory), matrix=MATRIX, today=TODAY
    )
    assert plan.ami.name == "dlami-base-oss-ubuntu22"
    assert not any("end of life" in warning for warning in plan.warnings)


def test_a_gpu_no_ami_supports(tmp_path):
    # A Pascal P100 (6.0): no variant's wheels carry sm_60, and no AMI family here drives it.
    directory = modified_catalog(
        tmp_path, "instances.toml", 'compute_capability = "7.0"', 'compute_capability = "6.0"'
    )
    catalog = load_catalog(directory)
    with pytest.raises(ConfigError, match=r"cu128's torch wheels carry no kernels for V100"):
        resolve("p3.2xlarge", "cu128", catalog=catalog, matrix=MATRIX, today=TODAY)
    with pytest.raises(ConfigError, match=r"no image variant runs on p3\.2xlarge"):
        resolve("p3.2xlarge", catalog=catalog, matrix=MATRIX, today=TODAY)


def test_multi_node_without_efa_is_allowed_with_a_warning():
    plan = resolve("g5.xlarge", "cu130", 4, catalog=CATALOG, matrix=MATRIX, today=TODAY)
    assert plan.nodes == 4
    assert any("no EFA" in warning and "TCP" in warning for warning in plan.warnings)
    single = resolve("g5.xlarge", "cu130", 1, catalog=CATALOG, matrix=MATRIX, today=TODAY)
    assert not any("EFA" in warning for warning in single.warnings)
    efa = resolve("p4d.24xlarge", "cu130", 4, catalog=CATALOG, matrix=MATRIX, today=TODAY)
    assert not any("EFA" in warning for warning in efa.warnings)


def test_price_caveats_become_warnings():
    # p5e.48xlarge in us-east-1: both prices are estimates (prices.toml); g5.xlarge's are
    # observed there.
    p5e = resolve("p5e.48xlarge", catalog=CATALOG, matrix=MATRIX, today=TODAY)
    assert any("on-demand price" in w and "estimate" in w for w in p5e.warnings)
    assert any("spot price" in w and "estimate" in w for w in p5e.warnings)
    g5 = resolve("g5.xlarge", catalog=CATALOG, matrix=MATRIX, today=TODAY)
    assert not any("estimate" in w or "upper bound" in w for w in g5.warnings)


@pytest.mark.parametrize("nodes", [0, -1, True, 1.5, "2", 257, 100000])
def test_bad_node_count(nodes):
    with pytest.raises(ConfigError, match="nodes must be a whole number from 1 to 256, got "):
        resolve("p4d.24xlarge", "auto", nodes, catalog=CATALOG, matrix=MATRIX, today=TODAY)


def test_unknown_instance_and_variant_name_what_exists():
    with pytest.raises(ConfigError, match=r"unknown instance type 'p3\.16xl'.*p3\.2xlarge"):
        resolve("p3.16xl", catalog=CATALOG, matrix=MATRIX, today=TODAY)
    with pytest.raises(ConfigError, match=r"unknown image variant 'cu129'.*cu128.*'auto'"):
        resolve("p4d.24xlarge", "cu129", catalog=CATALOG, matrix=MATRIX, today=TODAY)


def test_defaults_load_the_real_data_files():
    plan = resolve("p4d.24xlarge")
    assert plan.variant == MATRIX.variant("cu130") and plan.instance == CATALOG.instance(
        "p4d.24xlarge"
    )
