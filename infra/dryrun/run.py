"""Run the real Pulumi program offline: no Pulumi CLI, no AWS account, no credentials.

`run_program(config)` executes the repository's `__main__.py` under
`pulumi.runtime.set_mocks`, records every resource it registers (type, name,
inputs, provider) and resolves the stack outputs. The mocks answer the few
lookups the program makes (region, account, zones) with placeholders, and fill
in what AWS would compute (IDs, addresses, ARNs) with obviously fake values.

The tests assert on these recordings; `python -m infra plan --resources` prints
them (`describe_run`), so what one reads before `pulumi up` is what the program
really does.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import runpy
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi

from infra.config.schema import StackConfig
from infra.config.stack_file import (
    REPO_ROOT,
    config_text,
    load_stack_file,
    stack_file_config,
    stack_file_path,
    stack_file_region,
)
from infra.errors import ConfigError
from infra.knowledge.costs import cost_summary
from infra.knowledge.parallelcluster import load_parallelcluster
from infra.knowledge.profiles import load_profiles, resolve_profile
from infra.report import format_cluster, format_costs, format_plan

PROGRAM = REPO_ROOT / "__main__.py"
PROJECT = "gpu-training-stack"
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
class ProgramRun:
    resources: list[Recorded]
    outputs: dict[str, Any]

    def of_type(self, type_: str) -> list[Recorded]:
        return [r for r in self.resources if r.type == type_]

    def one(self, type_: str) -> Recorded:
        found = self.of_type(type_)
        if len(found) != 1:
            raise AssertionError(f"expected one {type_}, found {len(found)}")
        return found[0]


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
        if typ == "aws:cloudformation/stack:Stack":
            # The template's outputs as CloudFormation reports them once the stack exists.
            stack_name = inputs.get("name") or name
            return self._arn("cloudformation", f"stack/{stack_name}/offline"), {
                "outputs": {
                    "HeadNodeInstanceId": f"i-{number:017x}",
                    "HeadNodePrivateIp": f"10.42.0.{number % 250 + 4}",
                }
            }
        if typ == "aws:ec2/launchTemplate:LaunchTemplate":
            return f"lt-{number:017x}", {"latestVersion": 1, "defaultVersion": 1}
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


def run_program(
    config: Mapping[str, Any],
    *,
    stack: str = "offline",
    mocks: RecordingMocks | None = None,
    aws_region: str | None = None,
) -> ProgramRun:
    """Run __main__.py once under mocks with the given config (keys with or without "gpu:").

    Raises what the program raises: pulumi.RunError for bad config.
    """
    region = aws_region or (mocks.region if mocks else PLACEHOLDER_REGION)
    mocks = mocks if mocks is not None else RecordingMocks(region=region)
    settings = {"aws:region": region}
    settings.update({(k if ":" in k else f"gpu:{k}"): config_text(v) for k, v in config.items()})
    pulumi.runtime.set_all_config(settings)
    pulumi.runtime.reset_options(project=PROJECT, stack=stack, preview=False)
    pulumi.runtime.set_mocks(
        mocks, project=PROJECT, stack=stack, preview=False, logger=_QUIET_ENGINE
    )
    root = pulumi.runtime.get_root_resource()
    outputs: dict[str, Any] = {}

    @pulumi.runtime.test
    def program() -> pulumi.Output:
        runpy.run_path(str(PROGRAM), run_name="__main__")
        return pulumi.Output.from_input(dict(root.outputs)).apply(outputs.update)

    program()
    return ProgramRun(resources=list(mocks.resources), outputs=outputs)


# The program's warnings reach the run's outputs (and the plan `--resources` prints);
# keep the mock engine's own log quiet instead of printing them a second time.
_QUIET_ENGINE = logging.getLogger("infra.dryrun.run.engine")
_QUIET_ENGINE.addHandler(logging.NullHandler())
_QUIET_ENGINE.propagate = False


def run_stack_file(path: Path) -> ProgramRun:
    """Run the program with a stack file's config (stack name from Pulumi.<stack>.yaml)."""
    config = stack_file_config(path)
    stack = path.name.removeprefix("Pulumi.").removesuffix(".yaml")
    return run_program(config, stack=stack, aws_region=config.get("aws:region"))


# What `--resources` shows per resource type: (label, dotted input path) pairs.
_KEY_INPUTS: dict[str, tuple[tuple[str, str], ...]] = {
    "aws:ec2/launchTemplate:LaunchTemplate": (
        ("ami", "imageId"),
        ("type", "instanceType"),
        ("imds", "metadataOptions.httpTokens"),
        ("hop limit", "metadataOptions.httpPutResponseHopLimit"),
        ("root GiB", "blockDeviceMappings.0.ebs.volumeSize"),
        ("encrypted", "blockDeviceMappings.0.ebs.encrypted"),
    ),
    "aws:ec2/instance:Instance": (("market", "instanceMarketOptions.marketType"),),
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
    if resource.type == "aws:ec2/securityGroup:SecurityGroup":
        rules = [
            ",".join(rule.get("cidrBlocks", [])) for rule in resource.inputs.get("ingress", [])
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
    plan = stack.resolve_plan(region)
    profiles = load_profiles()
    # The profile's description and rationale hold only if the config keeps its plan.
    same = plan == resolve_profile(stack.profile, region=region)
    profile = profiles.get(stack.profile) if same else None
    cluster = (
        [] if plan.cluster is None else [format_cluster(plan, load_parallelcluster().head_node)]
    )
    return "\n".join(
        [
            format_plan(plan, profile=profile, rate=profiles.exchange_rate),
            *cluster,
            format_costs(cost_summary(plan, stack.guardrails, spot=stack.spot)),
            *(f"warning        {warning}" for warning in stack.guardrails.warnings),
        ]
    )


Command = tuple[Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], str]]


def with_resources(add_arguments: Callable, run: Callable) -> Command:
    """The `plan` command plus `--resources`: list what `pulumi up` would create.

    `python -m infra plan NAME --resources` runs the program with the config of
    the stack file Pulumi.NAME.yaml (NAME defaults to the default profile);
    `--stack-file PATH` names another one. It prints that config's plan and costs
    (`describe_stack`), then the resources (`describe_run`).
    """

    def add(parser: argparse.ArgumentParser) -> None:
        add_arguments(parser)
        parser.add_argument(
            "--resources",
            action="store_true",
            help="run the Pulumi program offline (mocks, no AWS) with the stack file "
            "Pulumi.PROFILE.yaml and list the resources it creates",
        )
        parser.add_argument(
            "--stack-file", type=Path, help="with --resources: the stack file to run"
        )

    def run_command(args: argparse.Namespace) -> str:
        if args.stack_file is not None and not args.resources:
            raise ConfigError("--stack-file goes with --resources")
        if not args.resources:
            return run(args)
        if args.instance or args.variant is not None or args.nodes is not None:
            raise ConfigError(
                "--resources runs a stack file: set gpu:instanceType, gpu:imageVariant or "
                "gpu:nodes there instead of --instance, --variant or --nodes"
            )
        path = args.stack_file or stack_file_path(args.profile or _default_stack())
        if not path.is_file():
            raise ConfigError(
                f"no stack file {path}: give a profile with a Pulumi.<profile>.yaml "
                "(a100x8, a100x8-80g, a100x2, v100x1) or --stack-file PATH"
            )
        try:
            run_result = run_stack_file(path)  # checks every key and value first
        except pulumi.RunError as exc:
            raise ConfigError(f"{path.name}: {exc}") from None
        return "\n".join(
            [
                f"stack file     {path.name}",
                # Priced where the offline run ran (a placeholder region without aws:region).
                describe_stack(
                    load_stack_file(path), stack_file_region(path) or PLACEHOLDER_REGION
                ),
                "",
                describe_run(run_result),
            ]
        )

    return add, run_command


def _default_stack() -> str:
    return load_profiles().default
