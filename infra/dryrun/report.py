"""What `python -m infra plan --resources` prints: a stack's plan and costs, and its resources."""

from __future__ import annotations

import json
from typing import Any

from infra.config.schema import StackConfig
from infra.dryrun.mocks import Recorded
from infra.dryrun.runner import ProgramRun
from infra.knowledge.costs import cost_summary, idle_cost, price_model
from infra.knowledge.parallelcluster import load_parallelcluster
from infra.knowledge.profiles import load_profiles, resolve_profile
from infra.knowledge.resolver import Plan
from infra.planning import resolve_plan
from infra.report import format_cluster, format_costs, format_idle, format_plan

# What `--resources` shows per resource type: (label, dotted input path) pairs.
_KEY_INPUTS: dict[str, tuple[tuple[str, str], ...]] = {
    "aws:ec2/launchTemplate:LaunchTemplate": (
        ("ami", "imageId"),
        ("type", "instanceType"),
        ("imds", "metadataOptions.httpTokens"),
        ("hop limit", "metadataOptions.httpPutResponseHopLimit"),
        ("root GiB", "blockDeviceMappings.0.ebs.volumeSize"),
        ("encrypted", "blockDeviceMappings.0.ebs.encrypted"),
        ("placement group", "placement.groupName"),
    ),
    "aws:ec2/instance:Instance": (("market", "instanceMarketOptions.marketType"),),
    "aws:ec2/placementGroup:PlacementGroup": (("strategy", "strategy"),),
    "aws:ec2/subnet:Subnet": (("zone", "availabilityZone"), ("cidr", "cidrBlock")),
    "aws:ec2/vpc:Vpc": (("cidr", "cidrBlock"),),
    "aws:ecr/repository:Repository": (
        ("tags", "imageTagMutability"),
        ("scan on push", "imageScanningConfiguration.scanOnPush"),
    ),
    "aws:s3/bucketVersioning:BucketVersioning": (("versioning", "versioningConfiguration.status"),),
    "aws:cloudwatch/logGroup:LogGroup": (("name", "name"), ("retention days", "retentionInDays")),
    "aws:budgets/budget:Budget": (("limit USD", "limitAmount"), ("period", "timeUnit")),
    "aws:cloudwatch/metricAlarm:MetricAlarm": (
        ("metric", "metricName"),
        ("threshold", "threshold"),
    ),
}


def _dig(value: Any, path: str) -> Any:
    for part in path.split("."):
        if isinstance(value, list):
            value = value[int(part)] if int(part) < len(value) else None
        elif isinstance(value, dict):
            value = value.get(part)
        else:
            return None
    return value


def _plain(value: Any) -> Any:
    """Numbers come back from the engine as floats: show 500, not 500.0."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def short_type(type_: str) -> str:
    """Short type name: aws:ec2/launchTemplate:LaunchTemplate is aws.ec2.LaunchTemplate."""
    package, module, name = [*type_.split(":"), "", ""][:3]
    if not name:
        return type_
    return f"{package}.{module.split('/')[0]}.{name}"


def _describe(resource: Recorded) -> str:
    details = []
    for label, path in _KEY_INPUTS.get(resource.type, ()):
        value = _dig(resource.inputs, path)
        if value is not None:
            details.append(f"{label}={_plain(value)}")
    if resource.type == "aws:ec2/launchTemplate:LaunchTemplate":
        kinds = [i.get("interfaceType") or "ena" for i in resource.inputs["networkInterfaces"]]
        details.append(f"interfaces={len(kinds)} ({', '.join(sorted(set(kinds)))})")
    if resource.type == "aws:ec2/securityGroup:SecurityGroup":
        rules = [
            "self" if rule.get("self") else ",".join(rule.get("cidrBlocks", []))
            for rule in resource.inputs.get("ingress", [])
        ]
        details.append(f"inbound={'; '.join(rules) or 'none'}")
    if resource.type == "aws:cloudformation/stack:Stack":
        details.append(_describe_cluster(json.loads(resource.inputs["templateBody"])))
    if resource.type == "aws:ec2/instance:Instance" and not resource.inputs.get(
        "instanceMarketOptions"
    ):
        details.append("market=on-demand")
    return "  ".join(details)


def _describe_cluster(template: dict) -> str:
    """A ParallelCluster stack's release and queue, read from its template."""
    resources = template["Resources"]
    url = resources["PclusterClusterProvider"]["Properties"]["TemplateURL"]["Fn::Sub"]
    version = url.split("/parallelcluster/")[1].split("/")[0]
    config = resources["PclusterCluster"]["Properties"]["ClusterConfiguration"]
    (queue,) = config["Scheduling"]["SlurmQueues"]
    (nodes,) = queue["ComputeResources"]
    return (
        f"ParallelCluster {version}  head node={config['HeadNode']['InstanceType']}  "
        f"queue {queue['Name']}={nodes['MinCount']}..{nodes['MaxCount']} x "
        f"{nodes['InstanceType']} {queue['CapacityType']}"
    )


def describe_run(run: ProgramRun) -> str:
    """The resources the program would create, with their key properties, and its image."""
    lines = [f"{len(run.resources)} resources (offline run of __main__.py under mocks):"]
    width = max(len(short_type(r.type)) for r in run.resources)
    for resource in run.resources:
        details = _describe(resource)
        lines.append(
            f"  {short_type(resource.type):<{width}}  {resource.name}"
            + (f"  {details}" if details else "")
        )
    lines.append(f"image: {run.outputs['image_uri']}")
    lines.append("IDs, addresses and names above are offline placeholders.")
    return "\n".join(lines)


def describe_stack(stack: StackConfig, region: str) -> str:
    """The plan a stack's config resolves to and what it costs, as plain `plan` prints them."""
    plan = resolve_plan(stack, region)
    profiles = load_profiles()
    # The profile's description and rationale hold only if the config keeps its plan.
    same = plan == resolve_profile(stack.profile, region=region)
    profile = profiles.get(stack.profile) if same else None
    cluster = [] if plan.cluster is None else [format_cluster(plan, load_parallelcluster())]
    return "\n".join(
        [
            format_plan(plan, profile=profile, rate=profiles.exchange_rate),
            *cluster,
            format_costs(cost_summary(plan, stack.guardrails, market=stack.market)),
            format_idle(idle_cost(plan, stack.root_volume_gib, *_cluster_standing_prices(plan))),
            "price model    "
            + price_model(
                plan,
                market=stack.market,
                capacity_reservation_id=stack.capacity_reservation_id,
                capacity_block_id=stack.capacity_block_id,
            ),
            *(f"warning        {warning}" for warning in stack.guardrails.warnings),
        ]
    )


def _cluster_standing_prices(plan: Plan) -> tuple[float | None, float]:
    """A cluster's head node $/h and its network's (the NAT gateway and its address) in the
    plan's region; (None, 0) without a cluster, whose network has no standing cost."""
    if plan.cluster is None:
        return None, 0.0
    parallelcluster, region = load_parallelcluster(), plan.price.region
    return (
        parallelcluster.head_node.price_in(region).on_demand_usd_per_hour,
        parallelcluster.network_usd_per_hour(region),
    )
