"""A stack's EBS volumes, as the spend guard prices them: they bill from creation to deletion,
whether their instance runs or is stopped.

Amazon EBS pricing (https://aws.amazon.com/ebs/pricing/, read 2026-12-01):
- a volume bills per GB-month of provisioned size, by the second, a month being the seconds
  of that calendar month (its example: 2,000 GB of gp3 for 12 hours of a 30-day month);
- gp3 includes 3,000 IOPS and 125 MB/s; above them, $0.005 per IOPS-month and $0.040 per
  MB/s-month (us-east-1);
- io1 and io2 bill $0.065 per provisioned IOPS-month (us-east-1; io2's cheaper tiers above
  32,000 IOPS are not used here, so such a volume counts a little too much, never too little).
EC2 gives each volume's type, size, IOPS, throughput and creation time
(DescribeVolumes, docs.aws.amazon.com/AWSEC2/latest/APIReference/API_Volume.html).
"""

from __future__ import annotations

import calendar
import datetime
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

GP3_FREE_IOPS = 3000
GP3_FREE_MBPS = 125
GP3_IOPS_USD_PER_MONTH = 0.005
GP3_MBPS_USD_PER_MONTH = 0.04
PROVISIONED_IOPS_USD_PER_MONTH = 0.065  # io1, io2
_PROVISIONED_IOPS_TYPES = ("io1", "io2")


@dataclass(frozen=True)
class Volume:
    volume_id: str
    created: datetime.datetime
    usd_per_month: float


def usd_per_month(volume: Mapping[str, Any], usd_per_gb_month: Mapping[str, float]) -> float:
    """What the volume bills in a month, from DescribeVolumes' fields; a type missing from the
    table counts at its dearest rate."""
    kind = volume["VolumeType"]
    rate = usd_per_gb_month.get(kind, max(usd_per_gb_month.values()))
    monthly = volume["Size"] * rate
    if kind == "gp3":
        monthly += max(0, volume.get("Iops", 0) - GP3_FREE_IOPS) * GP3_IOPS_USD_PER_MONTH
        monthly += max(0, volume.get("Throughput", 0) - GP3_FREE_MBPS) * GP3_MBPS_USD_PER_MONTH
    elif kind in _PROVISIONED_IOPS_TYPES:
        monthly += volume.get("Iops", 0) * PROVISIONED_IOPS_USD_PER_MONTH
    return monthly


def hours_in_month(moment: datetime.datetime) -> int:
    return calendar.monthrange(moment.year, moment.month)[1] * 24


def stack_volumes(
    ec2: Any,
    cost_tag: tuple[str, str],
    instances: Iterable[Mapping[str, Any]],
    usd_per_gb_month: Mapping[str, float],
) -> list[Volume]:
    """The volumes attached to the stack's instances (ParallelCluster's and moto's root volumes
    carry no cost tag) and those carrying its tag, attached or not."""
    key, value = cost_tag
    instance_ids = [i["InstanceId"] for i in instances if i["State"]["Name"] != "terminated"]
    filters = [[{"Name": f"tag:{key}", "Values": [value]}]]
    # DescribeVolumes takes up to 200 values per filter.
    filters += [
        [{"Name": "attachment.instance-id", "Values": instance_ids[start : start + 200]}]
        for start in range(0, len(instance_ids), 200)
    ]
    found: dict[str, Volume] = {}
    for volume_filter in filters:
        pages = ec2.get_paginator("describe_volumes").paginate(Filters=volume_filter)
        for page in pages:
            for volume in page["Volumes"]:
                created = volume["CreateTime"]
                found[volume["VolumeId"]] = Volume(
                    volume["VolumeId"],
                    created if created.tzinfo else created.replace(tzinfo=datetime.UTC),
                    usd_per_month(volume, usd_per_gb_month),
                )
    return sorted(found.values(), key=lambda v: v.volume_id)
