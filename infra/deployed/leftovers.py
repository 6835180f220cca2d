"""What still exists, and bills, after a stack is destroyed: found by its cost tag.

`down` runs this after Pulumi's destroy, so a user sees proof that nothing unexpected is
left (a volume a failed detach kept, an Elastic IP, a snapshot, a NAT gateway, a retained
log group) with what each costs a month, apart from what the stack keeps on purpose (the
checkpoint bucket and image repository) and what ParallelCluster keeps for every cluster of
the region (its `parallelcluster-*-v1-do-not-delete` bucket: aws-parallelcluster v3.15.1,
cli/src/pcluster/models/s3_bucket.py, S3Bucket.get_bucket_name).

Monthly figures are those of infra/knowledge/costs.py: volumes (by type), addresses and NAT
gateways at the region's rates, the rest at us-east-1 list prices. Instances are
listed at $0 a month once terminated; a stopped one bills only its volumes
(listed on their own).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from infra.cluster.config import cloudformation_stack_name
from infra.functions.volumes import usd_per_month
from infra.knowledge.costs import (
    HOURS_PER_MONTH,
    LOG_STORAGE_USD_PER_GB_MONTH,
    SNAPSHOT_USD_PER_GB_MONTH,
    network_usd_per_hour,
    volumes_and_addresses,
)

PARALLELCLUSTER_BUCKET = ("parallelcluster-", "-v1-do-not-delete")
# A cluster's CloudFormation stack is named for the cluster; its Lambda functions are named
# "pcluster-<function id>-<the UUID that ends the stack's id>", each with a log group
# "/aws/lambda/<function name>" kept on delete under the cluster's logs' DeletionPolicy
# (aws-parallelcluster 451cc5320d5d8a9318075990ead7f76f74372f85: cli/src/pcluster/models/
# cluster.py, Cluster.stack_name; cli/src/pcluster/templates/cdk_builder_utils.py,
# PCLUSTER_LAMBDA_PREFIX and PclusterLambdaConstruct; the functions CleanupResources in
# templates/cluster_stack.py and CleanupRoute53 in templates/slurm_builder.py).
PARALLELCLUSTER_FUNCTIONS = ("CleanupResources", "CleanupRoute53")
# The custom resource's provider, a stack nested in the stack's own, has one function,
# "pcluster-cfn-<the UUID that ends the provider stack's id>", whose log group
# "/aws/lambda/<function name>" is kept on delete (DeletionPolicy Retain: aws-parallelcluster
# cloudformation/custom_resource/cluster.yaml, PclusterCfnFunction and
# PclusterCfnFunctionLogGroup, commit 451cc5320d5d8a9318075990ead7f76f74372f85). A nested
# stack's summary names its parent (ListStacks, StackSummary.ParentId).
PROVIDER_FUNCTION = "pcluster-cfn"


@dataclass(frozen=True)
class Leftover:
    kind: str  # "volume", "elastic IP", ...
    resource_id: str
    monthly_usd: float
    detail: str = ""

    def describe(self) -> str:
        detail = f" ({self.detail})" if self.detail else ""
        return f"  {self.kind} {self.resource_id}{detail}: ${self.monthly_usd:,.2f} a month"


def tagged_leftovers(clients: Any, cost_tag: tuple[str, str]) -> list[Leftover]:
    """Everything still carrying the stack's cost tag that exists (or bills) in the region.

    `clients(service)` gives a boto3 client in the stack's region.
    """
    key, value = cost_tag
    tag_filter = [{"Name": f"tag:{key}", "Values": [value]}]
    ec2 = clients("ec2")
    region = ec2.meta.region_name
    ebs_usd_per_gb_month = volumes_and_addresses(region).ebs_usd_per_gb_month
    found: list[Leftover] = []
    for page in ec2.get_paginator("describe_instances").paginate(Filters=tag_filter):
        for reservation in page["Reservations"]:
            for instance in reservation["Instances"]:
                state = instance["State"]["Name"]
                if state != "terminated":
                    found.append(
                        Leftover(
                            "instance", instance["InstanceId"], 0.0, f"{state}; see its volumes"
                        )
                    )
    for volume in ec2.describe_volumes(Filters=tag_filter)["Volumes"]:
        found.append(
            Leftover(
                "volume",
                volume["VolumeId"],
                usd_per_month(volume, ebs_usd_per_gb_month),
                f"{volume['Size']} GiB, {volume['State']}",
            )
        )
    for address in ec2.describe_addresses(Filters=tag_filter)["Addresses"]:
        attached = address.get("AssociationId") or address.get("InstanceId")
        found.append(
            Leftover(
                "elastic IP",
                address.get("AllocationId", address["PublicIp"]),
                network_usd_per_hour(region, public_ipv4_addresses=1) * HOURS_PER_MONTH,
                f"{address['PublicIp']}, {'attached' if attached else 'unattached'}",
            )
        )
    for snapshot in ec2.describe_snapshots(OwnerIds=["self"], Filters=tag_filter)["Snapshots"]:
        found.append(
            Leftover(
                "snapshot",
                snapshot["SnapshotId"],
                snapshot["VolumeSize"] * SNAPSHOT_USD_PER_GB_MONTH,
                f"{snapshot['VolumeSize']} GiB",
            )
        )
    for gateway in ec2.describe_nat_gateways(Filters=tag_filter)["NatGateways"]:
        if gateway["State"] not in ("deleted", "deleting", "failed"):
            found.append(
                Leftover(
                    "NAT gateway",
                    gateway["NatGatewayId"],
                    network_usd_per_hour(region, nat_gateways=1) * HOURS_PER_MONTH,
                )
            )
    for interface in ec2.describe_network_interfaces(Filters=tag_filter)["NetworkInterfaces"]:
        found.append(
            Leftover("network interface", interface["NetworkInterfaceId"], 0.0, interface["Status"])
        )
    logs = clients("logs")
    for page in logs.get_paginator("describe_log_groups").paginate():
        for group in page["logGroups"]:
            tags = logs.list_tags_for_resource(resourceArn=group["arn"].removesuffix(":*"))
            if tags.get("tags", {}).get(key) == value:
                found.append(_log_group(group))
    return found


def parallelcluster_buckets(s3: Any) -> list[str]:
    """ParallelCluster's per-region buckets, shared by every cluster of the account."""
    prefix, suffix = PARALLELCLUSTER_BUCKET
    return sorted(
        bucket["Name"]
        for bucket in s3.list_buckets()["Buckets"]
        if bucket["Name"].startswith(prefix) and bucket["Name"].endswith(suffix)
    )


def cluster_log_groups(
    logs: Any, prefix: str | None, cloudformation: Any, cluster_name: str | None
) -> list[Leftover]:
    """The cluster's log groups, whose names start with the stack's
    `cluster_log_group_prefix` output (none without one), and, given the cluster's name,
    those of ParallelCluster's Lambda functions for it and of its custom resource's provider."""
    if not prefix:
        return []
    prefixes = [prefix]
    if cluster_name:
        summaries = _stack_summaries(cloudformation)
        ours = {
            summary["StackId"]
            for summary in summaries
            if summary["StackName"] == cloudformation_stack_name(cluster_name)
        }
        prefixes += [
            f"/aws/lambda/pcluster-{function}-{_uuid(summary)}"
            for summary in summaries
            if summary["StackName"] == cluster_name
            for function in PARALLELCLUSTER_FUNCTIONS
        ]
        prefixes += [
            f"/aws/lambda/{PROVIDER_FUNCTION}-{_uuid(summary)}"
            for summary in summaries
            if summary.get("ParentId") in ours
        ]
    return [
        _log_group(group)
        for name_prefix in dict.fromkeys(prefixes)
        for page in logs.get_paginator("describe_log_groups").paginate(
            logGroupNamePrefix=name_prefix
        )
        for group in page["logGroups"]
    ]


def _stack_summaries(cloudformation: Any) -> list[dict[str, Any]]:
    """Every CloudFormation stack of the region, live or deleted: ListStacks keeps deleted
    stacks for 90 days (AWS CloudFormation API Reference, ListStacks,
    docs.aws.amazon.com/AWSCloudFormation/latest/APIReference/API_ListStacks.html)."""
    pages = cloudformation.get_paginator("list_stacks").paginate()
    return [summary for page in pages for summary in page["StackSummaries"]]


def _uuid(summary: dict[str, Any]) -> str:
    """A stack id is arn:...:stack/<name>/<uuid>."""
    return summary["StackId"].rsplit("/", 1)[1]


def _log_group(group: dict[str, Any]) -> Leftover:
    gigabytes = group.get("storedBytes", 0) / 1e9
    return Leftover(
        "log group",
        group["logGroupName"],
        gigabytes * LOG_STORAGE_USD_PER_GB_MONTH,
        f"{gigabytes:.2f} GB stored",
    )


def unfinished_uploads(s3: Any, bucket: str) -> int:
    """Multipart uploads never completed or aborted: their parts bill as storage."""
    pages = s3.get_paginator("list_multipart_uploads").paginate(Bucket=bucket)
    return sum(len(page.get("Uploads", [])) for page in pages)
