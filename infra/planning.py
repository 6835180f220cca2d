"""From a parsed stack config to a checked plan, before any resource exists.

The `gpu:` models (infra/config) only parse and validate values. Here the config meets
the catalog, the ParallelCluster releases and the files it names: `resolve_plan` prices the
profile and its overrides for a region, `check_plan` runs the refusals that need the plan
(guardrails, the trainer's own checks on gpu:trainConfig), `train_config_text` reads the
training TOML, the stack's default job (infra/components/default_job.py). Each raises
ConfigError with one sentence naming the key.
"""

from __future__ import annotations

import tomllib
from collections.abc import Sequence

from images.matrix import arch_key
from infra.config.schema import StackConfig
from infra.errors import ConfigError
from infra.knowledge.catalog import load_catalog
from infra.knowledge.costs import hourly_usd
from infra.knowledge.parallelcluster import load_parallelcluster
from infra.knowledge.profiles import resolve_profile
from infra.knowledge.resolver import AUTO, Plan, resolve
from infra.node.boot import job_path_overrides
from infra.project import find_project_root
from training.spec.config import ConfigError as TrainConfigError
from training.spec.config import load_config, validate
from training.spec.selfcheck import SelfCheckError, check_precision


def resolve_plan(config: StackConfig, region: str) -> Plan:
    """The profile, with any instanceType / imageVariant / nodes override, resolved and
    priced for the stack's `region` (stack_region); on a Slurm cluster (gpu:cluster), for its
    ParallelCluster release's nodes."""
    try:
        load_catalog().prices.region(region)
    except ConfigError as exc:
        raise ConfigError(f"aws:region is {region!r}: {exc}") from None
    try:
        profile_plan = resolve_profile(config.profile, region=region)
    except ConfigError as exc:
        raise ConfigError(f"gpu:profile is {config.profile!r}: {exc}") from None
    if config.cluster is not None:
        return _resolve_for_cluster(config, profile_plan, region)
    if config.parallel_cluster_version is not None:
        raise ConfigError(
            f"gpu:parallelClusterVersion is {config.parallel_cluster_version!r}: it applies "
            "to a Slurm cluster only; set gpu:cluster: slurm or remove it"
        )
    overrides = {
        key: value
        for key, value in (
            ("instanceType", config.instance_type),
            ("imageVariant", config.image_variant),
            ("nodes", config.nodes),
        )
        if value is not None
    }
    if not overrides:
        return profile_plan
    instance_type = config.instance_type or profile_plan.instance.type
    if config.image_variant is not None:
        variant = config.image_variant
    elif config.instance_type is None:
        variant = profile_plan.variant.name
    else:
        variant = AUTO  # the profile's variant was chosen for another instance type
    nodes = config.nodes if config.nodes is not None else profile_plan.nodes
    try:
        return resolve(instance_type, variant, nodes, region=region)
    except ConfigError as exc:
        given = ", ".join(f"gpu:{key} is {value!r}" for key, value in overrides.items())
        raise ConfigError(f"{given}: {exc}") from None


def _resolve_for_cluster(config: StackConfig, profile_plan: Plan, region: str) -> Plan:
    parallelcluster = load_parallelcluster()
    try:
        release = parallelcluster.release(config.parallel_cluster_version)
    except ConfigError as exc:
        raise ConfigError(f"gpu:parallelClusterVersion: {exc}") from None
    try:
        # The head node and its network are priced for the region.
        parallelcluster.head_node.price_in(region)
        parallelcluster.network.price_in(region)
    except ConfigError as exc:
        raise ConfigError(f"aws:region is {region!r}: {exc}") from None
    instance_type = config.instance_type or profile_plan.instance.type
    # The profile's variant was chosen for the EC2 path's AMIs: pick again for the cluster's.
    variant = config.image_variant or AUTO
    nodes = config.nodes if config.nodes is not None else profile_plan.nodes
    try:
        return resolve(instance_type, variant, nodes, region=region, cluster=release)
    except ConfigError as exc:
        raise ConfigError(
            f"gpu:cluster is 'slurm' (ParallelCluster {release.version}): {exc}"
        ) from None


def check_plan(
    config: StackConfig, plan: Plan, overrides: Sequence[str] = (), *, named: str | None = None
) -> None:
    """The refusals that need the plan: the guardrails' (instance type allowed, budget at the
    price of the stack's market, alerts) and the trainer's on gpu:trainConfig, with
    `overrides` (`--set KEY=VALUE`) over it as the trainer will apply them. `named` is how
    the user gave the job (`run`'s "--config job.toml"), the key gpu:trainConfig otherwise."""
    config.guardrails.check_instance_type(plan.instance.type)
    config.guardrails.check_against(hourly_usd(plan, config.market))
    if config.train_config is not None:
        _check_train_config(config, plan, overrides, named)


def train_config_text(config: StackConfig, named: str | None = None) -> str | None:
    """gpu:trainConfig's TOML text, refused unless it parses; None when the key is unset
    (the image's default job)."""
    if config.train_config is None:
        return None
    # Relative to Pulumi.yaml, where the Pulumi CLI runs the program, whatever folder the
    # command line was started from.
    path = find_project_root() / config.train_config
    if not path.is_file():
        _refuse_train_config(
            config, "not a file (give the path of a training TOML, relative to Pulumi.yaml)", named
        )
    try:
        text = path.read_text()
        tomllib.loads(text)
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        _refuse_train_config(config, f"not valid TOML ({exc})", named)
    return text


def memory_line(config: StackConfig, plan: Plan) -> str | None:
    """GPU memory per rank of gpu:trainConfig's Hugging Face model (model.hf) on the plan's
    GPUs, from the trainer's estimate (training/estimate.py: config.json alone, no weights);
    None for any other job. ConfigError when the job's own setup cannot fit, with the
    change that would."""
    if config.train_config is None:
        return None
    train_config_text(config)  # readable, TOML
    paths = job_path_overrides(data_from_s3=config.data_s3_uri is not None)
    try:
        job = load_config(find_project_root() / config.train_config, env=paths)
    except TrainConfigError as exc:
        _refuse_train_config(config, str(exc))
    if not job.is_hf:
        return None
    # torch and transformers: only for a Hugging Face job, and only where the `train` extra
    # is installed; `pulumi up` needs requirements.txt alone.
    try:
        from training.estimate import RESERVE_FRACTION, fit
    except ImportError as exc:
        return (
            f"{job.model.hf}: not estimated ({exc.name} is not installed; "
            "pip install -e '.[train]' for the memory estimate)"
        )

    gpu = f"{plan.instance.gpu_model} {plan.instance.gpu_memory_gib} GiB"
    try:
        fits, needs, change = fit(
            job, gpus=plan.gpus, nodes=plan.nodes, memory_gib=plan.instance.gpu_memory_gib
        )
    except TrainConfigError as exc:  # config.json out of reach: the Hub, S3
        return f"{job.model.hf}: not estimated ({exc})"
    usable = plan.instance.gpu_memory_gib * (1 - RESERVE_FRACTION)
    where = f"{plan.gpus} x {gpu}, {usable:.1f} GiB usable"
    if not fits:
        _refuse_train_config(config, f"{job.model.hf} on {where}: {needs}; {change}")
    return f"{job.model.hf} on {where}: {needs}"


def _refuse_train_config(config: StackConfig, reason: str, named: str | None = None) -> None:
    raise ConfigError(f"{named or f'gpu:trainConfig is {str(config.train_config)!r}'}: {reason}")


def _check_train_config(
    config: StackConfig, plan: Plan, overrides: Sequence[str], named: str | None
) -> None:
    """Run the trainer's own start-up checks on gpu:trainConfig against the stack's GPUs.

    The node runs them again and exits 2, but only once the instances are up and billing;
    here a job the trainer would refuse fails `pulumi preview` instead. A model or data
    builder ("package.module:function") is checked for its form only: its package is in the
    image, not in this venv, so the node checks it imports.
    """
    train_config_text(config, named)  # readable, TOML
    paths = job_path_overrides(data_from_s3=config.data_s3_uri is not None)
    try:
        job = load_config(find_project_root() / config.train_config, overrides, env=paths)
        validate(job, world_size=plan.gpus, gpus_per_node=plan.instance.gpu_count)
        check_precision(
            bf16=job.precision.bf16,
            fp16=job.precision.fp16,
            on_gpu=True,  # every catalog instance has a GPU (gpu_count >= 1)
            capability=arch_key(plan.instance.compute_capability),
        )
    except (TrainConfigError, SelfCheckError) as exc:
        _refuse_train_config(
            config,
            f"the trainer would refuse it on {plan.nodes} x {plan.instance.type} (world size "
            f"{plan.gpus}, compute capability {plan.instance.compute_capability}): {exc}",
            named,
        )
