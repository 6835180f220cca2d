"""`doctor`: check this machine and the AWS account before renting GPUs, one line per check.

Local GPUs and driver against every image variant, a container runtime with GPU
support, the Pulumi CLI, shared memory, free disk for checkpoints, AWS credentials and region, and
the EC2 vCPU quota the chosen profile launches under. Each failing line says the fix.

Every probe of the outside world is a function in `Probes`, so each check can be
tested with a fake answer.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from common.market import Market
from common.setup_errors import problem_and_fix
from common.versions import version_key
from images.matrix import Matrix, load_matrix
from infra import targets
from infra.commands.outcome import Outcome
from infra.config.stack_file import load_stack_file, stack_file_path, stack_file_region
from infra.deployed.workspace import HOW_TO_INSTALL_PULUMI
from infra.knowledge.catalog import load_catalog
from infra.knowledge.profiles import load_profiles, resolve_profile
from infra.knowledge.quotas import QuotaNeed, quota_need
from infra.knowledge.resolver import DEFAULT_PLAN_REGION, Plan
from infra.node.local_job import IMAGE_ENV
from infra.planning import resolve_plan
from infra.report import format_table

GIB = 2**30
# DataLoader workers and NCCL's shared-memory transport live in /dev/shm; Docker gives a
# container 64 MiB unless run with --ipc=host or --shm-size (Docker run reference, "--shm-size").
MIN_SHM_BYTES = 1 * GIB
DEFAULT_MIN_FREE_GIB = 50.0
# Where the NVIDIA Container Toolkit writes its CDI spec (`nvidia-ctk cdi generate`), which
# Podman reads for `--device nvidia.com/gpu=all` (NVIDIA Container Toolkit docs, "CDI support").
CDI_SPECS = ("/etc/cdi/nvidia.yaml", "/var/run/cdi/nvidia.yaml")


@dataclass(frozen=True)
class Gpu:
    name: str
    driver: str
    capability: str  # "8.0"


@dataclass(frozen=True)
class Runtime:
    tool: str  # docker or podman
    gpu: bool  # can give containers the GPUs
    detail: str
    running: bool = True  # the engine answers


class ProbeError(Exception):
    """A probe could not get its answer; the message says what went wrong, `fix` (when the
    probe knows it) what to do."""

    def __init__(self, message: str, fix: str | None = None):
        super().__init__(message)
        self.fix = fix


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # ok, warn, FAIL
    finding: str
    fix: str = ""


def _nvml_gpus() -> list[Gpu]:
    """The NVIDIA GPUs NVML sees (nvidia-ml-py), else nvidia-smi's list, else none."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return _nvidia_smi_gpus()
    try:
        driver = pynvml.nvmlSystemGetDriverVersion()
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
            gpus.append(Gpu(pynvml.nvmlDeviceGetName(handle), driver, f"{major}.{minor}"))
        return gpus
    finally:
        pynvml.nvmlShutdown()


def _nvidia_smi_gpus() -> list[Gpu]:
    if shutil.which("nvidia-smi") is None:
        return []
    query = ["nvidia-smi", "--query-gpu=name,driver_version,compute_cap", "--format=csv,noheader"]
    result = subprocess.run(query, capture_output=True, text=True, timeout=30, check=False)
    if result.returncode != 0:
        return []
    rows = [line.split(", ") for line in result.stdout.splitlines() if line.strip()]
    return [Gpu(name, driver, capability) for name, driver, capability in rows]


def _container_runtime() -> Runtime | None:
    """Docker (with the nvidia runtime registered) or Podman (with an NVIDIA CDI spec)."""
    if shutil.which("docker"):
        result = subprocess.run(
            ["docker", "info", "--format", "{{json .Runtimes}}"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        if result.returncode != 0:
            return Runtime("docker", False, "its engine does not answer", running=False)
        runtimes = sorted(json.loads(result.stdout or "{}"))
        return Runtime("docker", "nvidia" in runtimes, f"runtimes {', '.join(runtimes)}")
    if shutil.which("podman"):
        specs = [p for p in CDI_SPECS if os.path.isfile(p)]
        return Runtime("podman", bool(specs), f"CDI spec {specs[0]}" if specs else "no CDI spec")
    return None


def _pulumi_version() -> str | None:
    """The installed Pulumi CLI's version (`pulumi version`), None when it is not on PATH."""
    if shutil.which("pulumi") is None:
        return None
    result = subprocess.run(
        ["pulumi", "version"], capture_output=True, text=True, timeout=60, check=False
    )
    return result.stdout.strip() or "unknown version"


def _shm_bytes() -> int | None:
    try:
        stat = os.statvfs("/dev/shm")
    except OSError:
        return None
    return stat.f_frsize * stat.f_blocks


def _free_bytes(path: Path) -> int:
    while not path.exists():
        path = path.parent
    return shutil.disk_usage(path).free


def _aws_identity(region: str | None) -> tuple[str, str | None]:
    """(account, region) from the default boto3 session; ProbeError without credentials."""
    import boto3
    import botocore.exceptions

    try:
        session = boto3.Session(region_name=region)
        if session.get_credentials() is None:
            raise ProbeError("no AWS credentials found")
        identity = session.client("sts").get_caller_identity()
    except botocore.exceptions.ClientError as exc:
        raise ProbeError(f"AWS refused the credentials ({exc})") from None
    except botocore.exceptions.BotoCoreError as exc:
        # A misspelt AWS_PROFILE, no network, an expired SSO login: said as such, with the fix.
        problem, fix = problem_and_fix(exc) or (f"cannot ask AWS who this is ({exc})", None)
        raise ProbeError(problem, fix) from None
    return identity["Account"], session.region_name


def _quota_vcpus(region: str, need: QuotaNeed) -> float | None:
    """The quota's value in vCPUs from Service Quotas (the preflight's reader); None if absent."""
    import boto3
    import botocore.exceptions

    from infra.preflight.quotas import quota_value

    try:
        answer = quota_value(need, boto3.client("service-quotas", region_name=region))
    except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
        raise ProbeError(f"cannot read it ({exc})") from None
    return None if answer is None else answer[1]


@dataclass(frozen=True)
class Probes:
    """How doctor looks at the world; tests replace single fields."""

    gpus: Callable[[], list[Gpu]] = _nvml_gpus
    container_runtime: Callable[[], Runtime | None] = _container_runtime
    pulumi_version: Callable[[], str | None] = _pulumi_version
    shm_bytes: Callable[[], int | None] = _shm_bytes
    free_bytes: Callable[[Path], int] = _free_bytes
    aws_identity: Callable[[str | None], tuple[str, str | None]] = _aws_identity
    quota_vcpus: Callable[[str, QuotaNeed], float | None] = _quota_vcpus
    env: dict[str, str] = field(default_factory=lambda: dict(os.environ))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "profile", nargs="?", help="profile (and its Pulumi.PROFILE.yaml) to check quotas for"
    )
    parser.add_argument("--region", help="AWS region (default: the stack file's, else AWS's)")
    parser.add_argument(
        "--checkpoint-dir", type=Path, default=Path("runs"), help="where checkpoints go locally"
    )
    parser.add_argument(
        "--min-free-gib",
        type=float,
        default=DEFAULT_MIN_FREE_GIB,
        help=f"free disk the checkpoints need (default {DEFAULT_MIN_FREE_GIB:g} GiB)",
    )


def run(args: argparse.Namespace, probes: Probes | None = None) -> Outcome:
    """Check GPUs, container runtime, shared memory, disk, AWS access and quotas here."""
    probes = probes or Probes()
    name = args.profile or load_profiles().default
    machine = targets.without_pulumi(name)
    if machine is not None:  # this machine is the stack: nothing is rented, no AWS to check
        jobs = Path(machine.stack.outputs.checkpoint_uri)
        checks = machine_checks(probes, load_matrix(), jobs, args.min_free_gib)
        return _report([_without_image(check) for check in checks], name)
    path = stack_file_path(name)
    region = args.region or (stack_file_region(path) if path.is_file() else None)
    # The plan gives the quota's instance type and vCPUs; its prices play no part here (the
    # region check says whether the region has any).
    priced = region if region in load_catalog().prices.regions else DEFAULT_PLAN_REGION
    if path.is_file():
        stack = load_stack_file(path)
        plan, market = resolve_plan(stack, priced), stack.market
    else:
        plan, market = resolve_profile(name, region=priced), Market.ON_DEMAND
    checks = run_checks(
        probes,
        matrix=load_matrix(),
        plan=plan,
        market=market,
        region=region,
        checkpoint_dir=args.checkpoint_dir,
        min_free_gib=args.min_free_gib,
    )
    return _report(checks, name)


def _without_image(check: Check) -> Check:
    """On the local stack a container runtime serves only jobs run in an image (its
    runner's IMAGE_ENV); without one named, a missing runtime stops nothing."""
    if check.name != "container" or check.status != "FAIL" or os.environ.get(IMAGE_ENV):
        return check
    finding = f"{check.finding} (jobs here run in this environment until {IMAGE_ENV} is set)"
    return dataclasses.replace(check, status="warn", finding=finding)


def _report(checks: list[Check], name: str) -> Outcome:
    failed = sum(check.status == "FAIL" for check in checks)
    table = format_table(
        ("", "CHECK", "FINDING"),
        [(c.status, c.name, c.finding + (f"; fix: {c.fix}" if c.fix else "")) for c in checks],
    )
    summary = f"{failed} check(s) failed" if failed else "every check passed"
    return Outcome(f"{table}\n{summary} (profile {name})", 1 if failed else 0)


def machine_checks(
    probes: Probes, matrix: Matrix, checkpoint_dir: Path, min_free_gib: float
) -> list[Check]:
    """This machine's own checks: what a job run here (or a node) needs."""
    return [
        gpu_check(probes.gpus(), matrix),
        runtime_check(probes.container_runtime()),
        shm_check(probes.shm_bytes()),
        disk_check(probes.free_bytes(checkpoint_dir), checkpoint_dir, min_free_gib),
    ]


def run_checks(
    probes: Probes,
    *,
    matrix: Matrix,
    plan: Plan,
    market: Market,
    region: str | None,
    checkpoint_dir: Path,
    min_free_gib: float,
) -> list[Check]:
    checks = machine_checks(probes, matrix, checkpoint_dir, min_free_gib)
    return checks + renting_checks(probes, plan=plan, market=market, region=region)


def renting_checks(
    probes: Probes, *, plan: Plan, market: Market, region: str | None
) -> list[Check]:
    """What `up` needs before it rents anything: the Pulumi CLI, AWS credentials, a priced
    region and the EC2 quota for the plan; it stops at the first that rules out the rest."""
    checks = [pulumi_check(probes.pulumi_version())]
    try:
        account, session_region = probes.aws_identity(region)
    except ProbeError as exc:
        checks.append(
            Check(
                "aws",
                "FAIL",
                str(exc),
                exc.fix or "run `aws configure` (or `aws sso login`), or set AWS_PROFILE",
            )
        )
        return checks
    checks.append(Check("aws", "ok", f"credentials for account {account}"))
    region = region or session_region
    checks.append(region_check(region))
    if region is not None:
        checks.append(quota_check(probes, region, plan, market))
    return checks


def gpu_check(gpus: list[Gpu], matrix: Matrix) -> Check:
    if not gpus:
        return Check(
            "gpu",
            "warn",
            "no NVIDIA GPU or driver here: plan and rent from here, train locally on CPU only",
            "to train locally, install an NVIDIA driver (nvidia-smi must list the GPU)",
        )
    first = gpus[0]
    what = f"{len(gpus)} x {first.name} (compute {first.capability}), driver {first.driver}"
    gpu_variants = [v for v in matrix.variants if v.cuda is not None]
    runs = [
        v.name
        for v in gpu_variants
        if v.runs_on(first.capability) and version_key(first.driver) >= version_key(v.min_driver)
    ]
    if runs:
        return Check("gpu", "ok", f"{what}: runs image variants {', '.join(runs)}")
    needs = ", ".join(f"{v.name} >= {v.min_driver}" for v in gpu_variants)
    return Check(
        "gpu",
        "FAIL",
        f"{what}: runs no image variant (drivers needed: {needs})",
        "update the NVIDIA driver, or use the cpu image",
    )


def runtime_check(runtime: Runtime | None) -> Check:
    if runtime is None:
        return Check(
            "container",
            "FAIL",
            "neither docker nor podman is installed",
            "install Docker Engine and the NVIDIA Container Toolkit",
        )
    if not runtime.running:
        return Check(
            "container",
            "FAIL",
            f"{runtime.tool} is installed but {runtime.detail}",
            "start it (`sudo systemctl start docker`) or add yourself to the docker group",
        )
    if runtime.gpu:
        return Check("container", "ok", f"{runtime.tool} with GPU support ({runtime.detail})")
    fix = (
        "install the NVIDIA Container Toolkit and run `nvidia-ctk runtime configure "
        "--runtime=docker`, then restart docker"
        if runtime.tool == "docker"
        else "install the NVIDIA Container Toolkit and run "
        "`nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml`"
    )
    return Check("container", "FAIL", f"{runtime.tool} without GPU support ({runtime.detail})", fix)


def pulumi_check(version: str | None) -> Check:
    if version is None:
        return Check(
            "pulumi",
            "FAIL",
            "the Pulumi CLI is not on PATH (up, preview and down run it)",
            HOW_TO_INSTALL_PULUMI,
        )
    return Check("pulumi", "ok", f"Pulumi CLI {version}")


def shm_check(shm: int | None) -> Check:
    run_with = "run containers with --ipc=host (the stack does) or --shm-size=16g"
    if shm is None:
        return Check("shm", "warn", "no /dev/shm on this machine", run_with)
    if shm < MIN_SHM_BYTES:
        return Check(
            "shm",
            "FAIL",
            f"/dev/shm holds {shm / 2**20:.0f} MiB, under {MIN_SHM_BYTES / GIB:.0f} GiB",
            f"{run_with}; on the host, remount /dev/shm larger",
        )
    return Check("shm", "ok", f"/dev/shm {shm / GIB:.1f} GiB; {run_with}")


def disk_check(free: int, path: Path, min_free_gib: float) -> Check:
    if free / GIB < min_free_gib:
        return Check(
            "disk",
            "FAIL",
            f"{free / GIB:.1f} GiB free for {path}, under {min_free_gib:g} GiB",
            "free space or give --checkpoint-dir on a larger disk (train.checkpoint_dir)",
        )
    return Check("disk", "ok", f"{free / GIB:.1f} GiB free for {path}")


def region_check(region: str | None) -> Check:
    if region is None:
        return Check(
            "region",
            "FAIL",
            "no AWS region set",
            "set aws:region in the stack file (`pulumi config set aws:region us-east-1`) "
            "or AWS_REGION",
        )
    priced = sorted(load_catalog().prices.regions)
    if region not in priced:
        return Check(
            "region",
            "FAIL",
            f"{region}: the catalog has no prices there, so the stack refuses it at preview",
            f"deploy to {', '.join(priced)}, or add its prices: "
            f"`python -m infra prices --refresh --region {region}`",
        )
    return Check("region", "ok", f"{region} (priced in the catalog)")


def quota_check(probes: Probes, region: str, plan: Plan, market: Market) -> Check:
    # quotas.toml names the spot and the on-demand quotas; reserved capacity (a reservation,
    # a capacity block) is checked against the on-demand one.
    market = Market.SPOT if market is Market.SPOT else Market.ON_DEMAND
    need = quota_need(plan, market)
    if need is None:
        return Check("quota", "warn", f"no EC2 quota recorded for {plan.instance.type} ({market})")
    what = f"{need.nodes} x {need.instance_type} needs {need.vcpus} vCPUs of '{need.name}'"
    request = (
        f"request {need.vcpus} vCPUs in the Service Quotas console ({region}, Amazon EC2, "
        f"'{need.name}'{f', {need.code}' if need.code else ''}); increases take hours to days"
    )
    try:
        value = probes.quota_vcpus(region, need)
    except ProbeError as exc:
        return Check(
            "quota",
            "warn",
            f"{what}: {exc}",
            "allow servicequotas:GetServiceQuota and ListServiceQuotas, or " + request,
        )
    if value is None:
        return Check("quota", "warn", f"{what}: no such quota in {region}", request)
    if value < need.vcpus:
        return Check("quota", "FAIL", f"{what}; {region} allows {value:g}", request)
    return Check("quota", "ok", f"{what}; {region} allows {value:g}")
