"""Which image variant and AMI may run on which instance, and what it costs.

Pure Python over the catalog and the image matrix (no Pulumi): the Pulumi
program, the plan command and the tests all ask this one function.

Rules (docs/catalog.md explains them):
- a GPU instance never gets the cpu variant;
- the variant's torch wheels must carry kernels the GPU can run
  (same major architecture, minor at most the GPU's: sm_89 runs sm_86);
- the AMI's driver must support the GPU and be at least the variant's
  `min_driver` (the toolkit driver, not the minor-version-compat floor);
- among AMIs that qualify, the first in amis.toml that is not past end of life
  wins; an end-of-life AMI is used only when nothing else runs the GPU, with a warning;
- "auto" picks the newest variant (highest CUDA) that some AMI can run;
- on a Slurm cluster the nodes boot ParallelCluster's own AMIs: the release's
  driver (data/parallelcluster.toml) must also be at least the variant's `min_driver`.
"""

from __future__ import annotations

import datetime
import re
from dataclasses import dataclass

from images.matrix import Matrix, MatrixError, Variant, arch_key, load_matrix
from infra.errors import ConfigError
from infra.knowledge.catalog import AmiFamily, Catalog, Instance, load_catalog
from infra.knowledge.parallelcluster import Release
from infra.knowledge.prices import InstancePrice

AUTO = "auto"
# The region a plan is priced for when no stack names one (`python -m infra plan --region`).
DEFAULT_PLAN_REGION = "us-east-1"


@dataclass(frozen=True)
class Plan:
    """The resolved answer for one stack: what runs where, and its hourly cost."""

    instance: Instance
    variant: Variant
    ami: AmiFamily
    nodes: int
    image_tag: str
    warnings: tuple[str, ...]
    on_demand_usd_per_hour: float  # all nodes
    spot_usd_per_hour: float  # all nodes
    price: InstancePrice  # per instance, in the plan's region
    cluster: Release | None = None  # the ParallelCluster release, on a Slurm cluster

    @property
    def gpus(self) -> int:
        return self.nodes * self.instance.gpu_count


# The most nodes a plan may have: a guard against a typo (100000), well above what one
# ParallelCluster queue of this stack is sized for; raise it here for a bigger quota.
MAX_NODES = 256


def resolve(
    instance_type: str,
    variant: str = AUTO,
    nodes: int = 1,
    *,
    catalog: Catalog | None = None,
    matrix: Matrix | None = None,
    today: datetime.date | None = None,
    region: str = DEFAULT_PLAN_REGION,
    cluster: Release | None = None,
) -> Plan:
    """Resolve an instance type, image variant (or "auto") and node count to a Plan, priced
    for `region`.

    With `cluster`, the nodes are that ParallelCluster release's compute nodes.
    Raises ConfigError with one sentence: what is wrong and what would work.
    """
    catalog = catalog if catalog is not None else load_catalog()
    matrix = matrix if matrix is not None else _load_matrix()
    today = today if today is not None else datetime.date.today()
    if isinstance(nodes, bool) or not isinstance(nodes, int) or not 1 <= nodes <= MAX_NODES:
        raise ConfigError(f"nodes must be a whole number from 1 to {MAX_NODES}, got {nodes!r}")
    instance = catalog.instance(instance_type)
    price = catalog.prices.price(region, instance_type)

    if variant == AUTO:
        chosen, ami = _newest_runnable(instance, catalog, matrix, today, cluster)
    else:
        chosen = _named_variant(matrix, variant)
        _check_gpu_runs(chosen, instance, matrix, catalog, today)
        ami = _pick_ami(chosen, instance, catalog, today)
        if ami is None:
            raise ConfigError(_no_ami_message(chosen, instance, catalog, matrix, today))
        if cluster is not None and not cluster.runs_driver(chosen.min_driver):
            raise ConfigError(
                _cluster_driver_message(chosen, instance, cluster, catalog, matrix, today)
            )

    return Plan(
        instance=instance,
        variant=chosen,
        ami=ami,
        nodes=nodes,
        image_tag=chosen.tag(matrix.release),
        warnings=_warnings(instance, price, ami, nodes, today),
        on_demand_usd_per_hour=nodes * price.on_demand_usd_per_hour,
        spot_usd_per_hour=nodes * price.spot_usd_per_hour,
        price=price,
        cluster=cluster,
    )


def _load_matrix() -> Matrix:
    try:
        return load_matrix()
    except MatrixError as exc:
        raise ConfigError(str(exc)) from None


def _named_variant(matrix: Matrix, name: str) -> Variant:
    try:
        return matrix.variant(name)
    except MatrixError as exc:
        raise ConfigError(f"{exc}, or {AUTO!r}") from None


def runnable_variants(
    instance: Instance,
    catalog: Catalog,
    matrix: Matrix,
    today: datetime.date,
    cluster: Release | None = None,
) -> list[tuple[Variant, AmiFamily]]:
    """Every GPU variant the instance (on `cluster`'s AMIs) runs, with its AMI, oldest first."""
    found = []
    for candidate in matrix.variants:
        if candidate.cuda is None or not candidate.runs_on(instance.compute_capability):
            continue
        if cluster is not None and not cluster.runs_driver(candidate.min_driver):
            continue
        ami = _pick_ami(candidate, instance, catalog, today)
        if ami is not None:
            found.append((candidate, ami))
    return found


def _newest_runnable(
    instance: Instance,
    catalog: Catalog,
    matrix: Matrix,
    today: datetime.date,
    cluster: Release | None = None,
) -> tuple[Variant, AmiFamily]:
    runnable = runnable_variants(instance, catalog, matrix, today, cluster)
    if not runnable and cluster is not None:
        raise ConfigError(
            f"no image variant runs on {instance.type} under ParallelCluster {cluster.version}, "
            f"whose AMIs carry NVIDIA driver {cluster.driver_version}: use a newer "
            "ParallelCluster release (gpu:parallelClusterVersion)"
        )
    if not runnable:
        raise ConfigError(
            f"no image variant runs on {instance.type} ({instance.gpu_model}, compute capability "
            f"{instance.compute_capability}) with an AMI in the catalog: add a variant whose "
            "torch wheels carry that architecture, or an AMI whose driver supports it"
        )
    return runnable[-1]


def _check_gpu_runs(
    variant: Variant, instance: Instance, matrix: Matrix, catalog: Catalog, today: datetime.date
) -> None:
    if variant.cuda is None:
        raise ConfigError(
            f"image variant 'cpu' has no CUDA, so it would leave the {instance.gpu_count}x "
            f"{instance.gpu_model} of {instance.type} idle; use "
            f"{_alternatives(instance, catalog, matrix, today)}"
        )
    if variant.runs_on(instance.compute_capability):
        return
    arch = f"sm_{instance.compute_capability.replace('.', '')}"
    toolkit = matrix.cuda_major(variant)
    if toolkit and arch_key(instance.compute_capability) < arch_key(toolkit.oldest_arch):
        major = variant.cuda.split(".")[0]
        reason = f"CUDA {major} dropped {instance.gpu_model}'s architecture ({arch})"
    else:
        reason = (
            f"{variant.name}'s torch wheels carry no kernels for {instance.gpu_model} ({arch}; "
            f"they carry {', '.join(variant.compute_capabilities)})"
        )
    raise ConfigError(
        f"image variant {variant.name!r} cannot run on {instance.type}: {reason}; use "
        f"{_alternatives(instance, catalog, matrix, today)}"
    )


def _alternatives(
    instance: Instance,
    catalog: Catalog,
    matrix: Matrix,
    today: datetime.date,
    cluster: Release | None = None,
) -> str:
    """The variants that do run on `instance`, for "use ..." in an error message."""
    runnable = runnable_variants(instance, catalog, matrix, today, cluster)
    names = [v.name for v, _ in runnable]
    if not names:
        return "an instance with a GPU this matrix supports"
    return " or ".join(repr(n) for n in names) + f" (or {AUTO!r})"


def _pick_ami(
    variant: Variant, instance: Instance, catalog: Catalog, today: datetime.date
) -> AmiFamily | None:
    """The preferred AMI whose driver supports the GPU and runs the variant."""
    fits = [
        ami
        for ami in catalog.amis
        if ami.supports(instance.compute_capability) and ami.runs_driver(variant.min_driver)
    ]
    # Stable sort: keeps the file's preference order within "alive" and "past EOL".
    fits.sort(key=lambda ami: ami.past_end_of_life(today))
    return fits[0] if fits else None


def _no_ami_message(
    variant: Variant, instance: Instance, catalog: Catalog, matrix: Matrix, today: datetime.date
) -> str:
    for_gpu = [ami for ami in catalog.amis if ami.supports(instance.compute_capability)]
    if not for_gpu:
        return (
            f"no AMI family in the catalog supports {instance.gpu_model} "
            f"(compute capability {instance.compute_capability}) of {instance.type}; add an "
            "AMI family whose driver does to infra/knowledge/data/amis.toml, or pick another "
            "instance type"
        )
    drivers = ", ".join(f"{ami.name} has {ami.driver_version}" for ami in for_gpu)
    return (
        f"image variant {variant.name!r} needs NVIDIA driver {variant.min_driver} or newer, "
        f"but the AMIs for {instance.type} are older ({drivers}); use "
        f"{_alternatives(instance, catalog, matrix, today)}"
    )


def _cluster_driver_message(
    variant: Variant,
    instance: Instance,
    cluster: Release,
    catalog: Catalog,
    matrix: Matrix,
    today: datetime.date,
) -> str:
    return (
        f"image variant {variant.name!r} needs NVIDIA driver {variant.min_driver} or newer, "
        f"but ParallelCluster {cluster.version}'s AMIs carry {cluster.driver_version}; use "
        f"{_alternatives(instance, catalog, matrix, today, cluster)}, or a ParallelCluster "
        "release whose driver runs it (gpu:parallelClusterVersion, "
        "infra/knowledge/data/parallelcluster.toml)"
    )


def _warnings(
    instance: Instance, price: InstancePrice, ami: AmiFamily, nodes: int, today: datetime.date
) -> tuple[str, ...]:
    warnings = []
    family = re.match(r"[a-z]+\d", instance.type)
    if ami.past_end_of_life(today) and family is not None and family[0] in ami.no_longer_supports:
        # One line, first: no AMI AWS supports boots this GPU any more.
        warnings.append(
            f"no AMI that AWS supports boots {instance.type} any more: {ami.description} "
            f"is the only family here with a driver for {instance.gpu_model} (driver "
            f"{ami.driver_version} runs the image), but its last release no longer lists "
            f"{family[0].upper()} and it is past end of life since "
            f"{ami.end_of_life.isoformat()}; the stack boots it unsupported: move to a newer "
            "GPU (g4dn, g5, g6 and later run the open-driver AMIs)"
        )
    elif ami.past_end_of_life(today):
        warnings.append(
            f"AMI family {ami.name} ({ami.os}) is past end of life since "
            f"{ami.end_of_life.isoformat()}: no security updates; it is the only AMI family "
            f"here that runs this image on {instance.gpu_model}, so plan a move to a newer GPU"
        )
    # Multi-node without EFA is allowed, not refused: NCCL falls back to TCP sockets,
    # which is slow for large all-reduces but works, and small data-parallel jobs on
    # cheap single-GPU types are a legitimate way to use spare capacity.
    if nodes > 1 and instance.efa_interfaces == 0:
        warnings.append(
            f"{instance.type} has no EFA: {nodes} nodes will talk over TCP sockets, "
            "so gradient all-reduce between nodes will be slow; prefer an EFA type "
            "(e.g. p4d.24xlarge, g6e.12xlarge) for multi-node training"
        )
    if price.on_demand_upper_bound:
        warnings.append(
            f"the on-demand price of {instance.type} predates AWS's June 2025 price cut "
            "(up to 45%): treat it as an upper bound"
        )
    if price.on_demand_estimated:
        warnings.append(
            f"the on-demand price of {instance.type} in {price.region} is an estimate, "
            "not an observed figure (infra/knowledge/data/prices.toml says how it was made)"
        )
    if price.spot_estimated:
        warnings.append(
            f"the spot price of {instance.type} in {price.region} is an estimate, "
            "not an observed figure"
        )
    return tuple(warnings)
