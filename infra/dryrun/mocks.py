"""Pulumi mocks that answer like a quiet AWS account and record what the program registers.

Lookups the program makes (region, account, zones, the default VPC) get placeholders; what AWS
would compute (IDs, addresses, ARNs) gets obviously fake values. Mocks accept anything: every
AWS behaviour a resource relies on is written, with its source, beside the resource.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pulumi

PLACEHOLDER_ACCOUNT = "123456789012"
PLACEHOLDER_REGION = "us-east-1"


@dataclass(frozen=True)
class Recorded:
    """One resource the program registered."""

    type: str
    name: str
    id: str
    inputs: dict[str, Any]
    provider: str | None  # "<provider urn>::<provider id>"
    state: dict[str, Any]


@dataclass
class RecordingMocks(pulumi.runtime.Mocks):
    """Answers the program's resource registrations and lookups like a quiet AWS account."""

    region: str = PLACEHOLDER_REGION
    account: str = PLACEHOLDER_ACCOUNT
    # Zones that offer every instance type; a test narrows it to check zone selection.
    offering_zones: tuple[str, ...] = ()
    resources: list[Recorded] = field(default_factory=list)
    calls: list[tuple[str, dict]] = field(default_factory=list)
    _counter: itertools.count = field(default_factory=lambda: itertools.count(1))

    def __post_init__(self) -> None:
        if not self.offering_zones:
            self.offering_zones = tuple(f"{self.region}{suffix}" for suffix in "abcd")

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict]:
        number = next(self._counter)
        resource_id, computed = self._computed(args.typ, args.name, args.inputs, number)
        state = {**args.inputs, **computed}
        self.resources.append(
            Recorded(args.typ, args.name, resource_id, dict(args.inputs), args.provider, state)
        )
        return resource_id, state

    def call(self, args: pulumi.runtime.MockCallArgs) -> dict:
        self.calls.append((args.token, dict(args.args)))
        return self._lookup(args.token, args.args)

    def _arn(self, service: str, resource: str, *, regional: bool = True) -> str:
        region = self.region if regional else ""
        return f"arn:aws:{service}:{region}:{self.account}:{resource}"

    def _computed(
        self, typ: str, name: str, inputs: Mapping[str, Any], number: int
    ) -> tuple[str, dict]:
        """(id, outputs AWS would fill in) for the resource types whose outputs the program uses."""
        if typ == "aws:ec2/instance:Instance":
            instance_id = f"i-{number:017x}"
            computed = {
                "privateIp": f"10.42.0.{number % 250 + 4}",
                "primaryNetworkInterfaceId": f"eni-{number:017x}",
                "arn": self._arn("ec2", f"instance/{instance_id}"),
            }
            if inputs.get("instanceMarketOptions"):
                computed["spotInstanceRequestId"] = f"sir-{number:08x}"
            return instance_id, computed
        if typ == "aws:s3/bucket:Bucket":
            bucket = inputs.get("bucket") or f"{name}-{number:07x}"
            return bucket, {"bucket": bucket, "arn": f"arn:aws:s3:::{bucket}"}
        if typ == "aws:ecr/repository:Repository":
            repo = inputs.get("name") or f"{name}-{number:07x}"
            return repo, {
                "name": repo,
                "arn": self._arn("ecr", f"repository/{repo}"),
                "repositoryUrl": f"{self.account}.dkr.ecr.{self.region}.amazonaws.com/{repo}",
            }
        if typ == "aws:cloudwatch/logGroup:LogGroup":
            group = inputs.get("name") or f"{name}-{number:07x}"
            return group, {"name": group, "arn": self._arn("logs", f"log-group:{group}")}
        if typ == "aws:ec2/launchTemplate:LaunchTemplate":
            return f"lt-{number:017x}", {"latestVersion": 1, "defaultVersion": 1}
        if typ == "aws:cloudformation/stack:Stack":
            # The template's outputs as CloudFormation reports them once the stack exists.
            stack_name = inputs.get("name") or name
            return self._arn("cloudformation", f"stack/{stack_name}/offline"), {
                "outputs": {
                    "HeadNodeInstanceId": f"i-{number:017x}",
                    "HeadNodePrivateIp": f"10.42.0.{number % 250 + 4}",
                }
            }
        resource_name = inputs.get("name") or f"{name}-{number:07x}"
        service = typ.split(":")[1].split("/")[0] if ":" in typ else "unknown"
        return f"{name}-{number:07x}", {
            "name": resource_name,
            "arn": inputs.get("arn") or self._arn(service, resource_name),
        }

    def _lookup(self, token: str, args: Mapping[str, Any]) -> dict:
        if token == "aws:index/getRegion:getRegion":
            return {
                "id": self.region,
                "region": self.region,
                "name": self.region,
                "endpoint": f"ec2.{self.region}.amazonaws.com",
                "description": "offline",
            }
        if token == "aws:index/getCallerIdentity:getCallerIdentity":
            return {
                "id": self.account,
                "accountId": self.account,
                "userId": "OFFLINE",
                "arn": f"arn:aws:iam::{self.account}:user/offline",
            }
        if token == "aws:index/getPartition:getPartition":
            return {"id": "aws", "partition": "aws", "dnsSuffix": "amazonaws.com"}
        if token == "aws:ec2/getInstanceTypeOfferings:getInstanceTypeOfferings":
            types = [v for f in args.get("filters", []) for v in f.get("values", [])]
            return {
                "id": self.region,
                "locations": list(self.offering_zones),
                "locationTypes": ["availability-zone"] * len(self.offering_zones),
                "instanceTypes": types[:1] * len(self.offering_zones),
            }
        if token == "aws:ec2/getVpc:getVpc":
            return {"id": "vpc-default", "cidrBlock": "172.31.0.0/16", "default": True}
        if token == "aws:ec2/getSubnet:getSubnet":
            zone = args.get("availabilityZone", f"{self.region}a")
            return {"id": f"subnet-default-{zone}", "availabilityZone": zone}
        return {}
