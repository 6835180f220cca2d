"""`doctor` with faked probes: each check passes on a good answer and fails with its fix."""

import argparse
import dataclasses
from pathlib import Path

import pytest

from common.market import Market
from common.versions import version_key
from images.matrix import load_matrix
from infra.commands import doctor
from infra.commands.doctor import Gpu, ProbeError, Probes, Runtime
from infra.knowledge.catalog import load_catalog
from infra.knowledge.profiles import resolve_profile

GIB = 2**30
MATRIX = load_matrix()


def good_probes(**changes) -> Probes:
    newest = max((v for v in MATRIX.variants if v.cuda), key=lambda v: version_key(v.min_driver))
    probes = Probes(
        gpus=lambda: [Gpu("NVIDIA A100-SXM4-40GB", newest.min_driver, "8.0")],
        container_runtime=lambda: Runtime("docker", True, "runtimes nvidia, runc"),
        pulumi_version=lambda: "v3.210.0",
        shm_bytes=lambda: 32 * GIB,
        free_bytes=lambda path: 500 * GIB,
        aws_identity=lambda region: ("123456789012", "us-east-1"),
        quota_vcpus=lambda region, quota: 1024.0,
    )
    return dataclasses.replace(probes, **changes)


def checks(probes: Probes, *, profile="a100x8", market=Market.ON_DEMAND, region=None):
    return {
        c.name: c
        for c in doctor.run_checks(
            probes,
            matrix=MATRIX,
            plan=resolve_profile(profile),
            market=market,
            region=region,
            checkpoint_dir=Path("runs"),
            min_free_gib=50,
        )
    }


def test_everything_good_passes():
    found = checks(good_probes())
    assert [c.status for c in found.values()] == ["ok"] * 8
    assert set(found) == {"gpu", "container", "pulumi", "shm", "disk", "aws", "region", "quota"}


def test_driver_too_old_for_every_variant_fails_with_the_drivers_needed():
    oldest = min(
        (v.min_driver for v in MATRIX.variants if v.cuda), key=version_key
    )  # one below the lowest minimum
    major = int(oldest.split(".")[0]) - 1
    found = checks(good_probes(gpus=lambda: [Gpu("Tesla V100", f"{major}.0", "7.0")]))["gpu"]
    assert found.status == "FAIL" and "update the NVIDIA driver" in found.fix
    assert all(f"{v.name} >= {v.min_driver}" in found.finding for v in MATRIX.variants if v.cuda)


def test_gpu_lists_exactly_the_variants_its_driver_and_architecture_run():
    driver = "999.0"
    found = checks(good_probes(gpus=lambda: [Gpu("Tesla V100", driver, "7.0")]))["gpu"]
    expected = [v.name for v in MATRIX.variants if v.cuda and "7.0" in v.compute_capabilities]
    assert found.status == "ok" and found.finding.endswith(", ".join(expected))
    assert "cu130" not in expected  # CUDA 13 dropped the V100


def test_no_gpu_is_a_warning_not_a_failure():
    found = checks(good_probes(gpus=lambda: []))["gpu"]
    assert found.status == "warn" and "nvidia-smi" in found.fix


@pytest.mark.parametrize(
    ("runtime", "fix"),
    [
        (None, "install Docker Engine and the NVIDIA Container Toolkit"),
        (Runtime("docker", False, "runtimes runc"), "nvidia-ctk runtime configure"),
        (Runtime("podman", False, "no CDI spec"), "nvidia-ctk cdi generate"),
        (Runtime("docker", False, "its engine does not answer", running=False), "start it"),
    ],
)
def test_container_runtime_without_gpu_support_fails(runtime, fix):
    found = checks(good_probes(container_runtime=lambda: runtime))["container"]
    assert found.status == "FAIL" and fix in found.fix


def test_no_pulumi_cli_fails_with_the_install_command():
    found = checks(good_probes(pulumi_version=lambda: None))["pulumi"]
    assert found.status == "FAIL" and "get.pulumi.com" in found.fix


def test_dockers_default_shared_memory_fails():
    found = checks(good_probes(shm_bytes=lambda: 64 * 2**20))["shm"]
    assert found.status == "FAIL" and "64 MiB" in found.finding and "--ipc=host" in found.fix


def test_too_little_disk_for_checkpoints_fails():
    found = checks(good_probes(free_bytes=lambda path: 10 * GIB))["disk"]
    assert found.status == "FAIL" and "10.0 GiB free" in found.finding


def test_no_credentials_fails_and_skips_the_account_checks():
    def no_credentials(region):
        raise ProbeError("no AWS credentials found")

    found = checks(good_probes(aws_identity=no_credentials))
    assert found["aws"].status == "FAIL" and "aws configure" in found["aws"].fix
    assert "quota" not in found and "region" not in found


def test_no_region_fails():
    found = checks(good_probes(aws_identity=lambda region: ("123456789012", None)))
    assert found["region"].status == "FAIL" and "aws:region" in found["region"].fix
    assert "quota" not in found


def test_a_region_the_catalog_does_not_price_fails_with_the_priced_ones():
    found = checks(good_probes(), region="ap-south-2")["region"]
    assert found.status == "FAIL" and "no prices there" in found.finding
    assert all(region in found.fix for region in load_catalog().prices.regions)
    assert "prices --refresh --region ap-south-2" in found.fix
    assert checks(good_probes(), region="eu-west-1")["region"].status == "ok"


def test_quota_below_what_the_profile_needs_fails_with_the_quota_to_raise():
    asked = []

    def zero(region, quota):
        asked.append((region, quota))
        return 0.0

    found = checks(good_probes(quota_vcpus=zero), profile="a100x8", market=Market.SPOT)["quota"]
    p4d = load_catalog().instance("p4d.24xlarge")
    assert found.status == "FAIL" and f"needs {p4d.vcpus} vCPUs" in found.finding
    assert asked[0][0] == "us-east-1"
    assert asked[0][1].name == "All P4, P3 and P2 Spot Instance Requests"
    assert asked[0][1].vcpus == p4d.vcpus and asked[0][1].market == "spot"
    assert "Service Quotas console" in found.fix and str(p4d.vcpus) in found.fix


def test_on_demand_quota_is_asked_by_its_code():
    asked = []
    checks(good_probes(quota_vcpus=lambda r, q: asked.append(q) or 96.0), profile="l40sx4")
    assert asked[0].code == "L-DB2E81BA"  # g6e: Running On-Demand G and VT instances


def test_unreadable_quota_warns_with_the_permission():
    def denied(region, quota):
        raise ProbeError("cannot read it (AccessDenied)")

    found = checks(good_probes(quota_vcpus=denied))["quota"]
    assert found.status == "warn" and "servicequotas:GetServiceQuota" in found.fix


def test_run_prints_one_line_per_check_and_exits_1_on_a_failure():
    args = argparse.Namespace(
        profile="l4x1", region=None, checkpoint_dir=Path("runs"), min_free_gib=50.0
    )
    outcome = doctor.run(args, good_probes(shm_bytes=lambda: 64 * 2**20))
    lines = outcome.text.splitlines()
    assert outcome.exit_code == 1
    assert len(lines) == 1 + 8 + 1  # header, one line per check, summary
    assert lines[-1] == "1 check(s) failed (profile l4x1)"
    assert next(line for line in lines if " shm " in line).startswith("FAIL")
    assert doctor.run(args, good_probes()).exit_code == 0


def test_the_local_stack_checks_this_machine_only_and_needs_docker_only_for_an_image(
    monkeypatch, tmp_path
):
    monkeypatch.setenv("GPU_STACK_LOCAL_DIR", str(tmp_path))
    monkeypatch.delenv("GPU_STACK_LOCAL_IMAGE", raising=False)
    probes = good_probes(container_runtime=lambda: None)
    args = argparse.Namespace(profile="local", region=None, checkpoint_dir=None, min_free_gib=50)
    outcome = doctor.run(args, probes=probes)
    rows = {line.split()[1]: line.split()[0] for line in outcome.text.splitlines()[1:-1]}
    # Nothing is rented: no Pulumi, AWS or quota check; no runtime stops a job run here.
    assert rows == {"gpu": "ok", "container": "warn", "shm": "ok", "disk": "ok"}
    assert outcome.exit_code == 0
    monkeypatch.setenv("GPU_STACK_LOCAL_IMAGE", "gpu-training:cu130")
    outcome = doctor.run(args, probes=probes)
    assert "FAIL  container" in outcome.text and outcome.exit_code == 1
