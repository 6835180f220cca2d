"""Before anything is created: does the account's EC2 quota let the stack's nodes run?

New accounts start at 0 vCPUs for GPU families, and EC2 refuses the launch only after the
rest of the stack exists (VcpuLimitExceeded). With credentials, the program reads the quota
from Service Quotas (GetServiceQuota, or ListServiceQuotas by name; IAM:
servicequotas:GetServiceQuota, servicequotas:ListServiceQuotas) and refuses in one sentence
naming the quota, the need and the request command. Without credentials (a first preview,
the offline plan) it says it skipped the check. The quota caps all running instances of the
family: instances already running elsewhere in the region are not counted here.
"""

from __future__ import annotations

import math
import os
from typing import Any

import boto3
from botocore.exceptions import BotoCoreError, ClientError

from infra.errors import ConfigError
from infra.knowledge.quotas import QuotaNeed

# Set by the offline runner (infra.dryrun.runner): no AWS call from a mocked run.
OFFLINE_ENV = "GPU_STACK_OFFLINE"


def quota_value(need: QuotaNeed, client: Any) -> tuple[str, float] | None:
    """(quota code, value in vCPUs) from Service Quotas, or None when the account lists none."""
    if need.code is not None:
        quota = client.get_service_quota(ServiceCode="ec2", QuotaCode=need.code)["Quota"]
        return quota["QuotaCode"], quota["Value"]
    found = {}
    for page in client.get_paginator("list_service_quotas").paginate(ServiceCode="ec2"):
        found |= {quota["QuotaName"]: quota for quota in page["Quotas"]}
    for name in need.names:
        if name in found:
            return found[name]["QuotaCode"], found[name]["Value"]
    return None


def check_quota(need: QuotaNeed, client: Any, region: str) -> str | None:
    """Refuse (ConfigError) when the quota is below the need; else a line saying what was read."""
    answer = quota_value(need, client)
    if answer is None:
        return f"Service Quotas lists no {need.name!r} in {region}: quota not checked"
    code, value = answer
    if value >= need.vcpus:
        return f"{need.name} ({code}) in {region}: {value:g} vCPUs, the stack needs {need.vcpus}"
    raise ConfigError(
        f"the EC2 quota {need.name!r} ({code}) in {region} is {value:g} vCPUs, but "
        f"{need.nodes} x {need.instance_type} ({need.market}) needs {need.vcpus}: ask for it "
        f"with aws service-quotas request-service-quota-increase --service-code ec2 "
        f"--quota-code {code} --desired-value {math.ceil(need.vcpus)} --region {region} "
        "(increases take hours to days), or pick a smaller profile"
    )


def preflight_quota(
    need: QuotaNeed | None, *, region: str | None, profile: str | None
) -> str | None:
    """Check `need` with the stack's credentials; None when there is nothing to check."""
    if need is None or os.environ.get(OFFLINE_ENV):
        return None
    session = boto3.Session(profile_name=profile, region_name=region)
    region = session.region_name
    if session.get_credentials() is None:
        return f"no AWS credentials: the {need.name!r} quota was not checked"
    try:
        return check_quota(need, session.client("service-quotas"), region)
    except (BotoCoreError, ClientError) as error:
        return f"could not read the {need.name!r} quota ({error}): not checked"
