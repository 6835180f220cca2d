"""Run the real Pulumi program (__main__.py) under mocks and read what it registered."""

from __future__ import annotations

import base64
import gzip
import json
import zlib
from typing import Any

import yaml

from infra.dryrun.mocks import Recorded, RecordingMocks
from infra.dryrun.runner import ProgramRun, run_program
from tests.support.mock_runs import of_type

INSTANCE = "aws:ec2/instance:Instance"
LAUNCH_TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
SECURITY_GROUP = "aws:ec2/securityGroup:SecurityGroup"
ROLE_POLICY = "aws:iam/rolePolicy:RolePolicy"
PLACEMENT_GROUP = "aws:ec2/placementGroup:PlacementGroup"
LOG_GROUP = "aws:cloudwatch/logGroup:LogGroup"
BUCKET_OBJECT = "aws:s3/bucketObjectv2:BucketObjectv2"

# Guardrail keys every test stack needs: someone to alert, and a budget above an hour of 2 nodes.
BASE_CONFIG = {"alertEmails": ["ml-team@example.com"], "budgetUsd": 1000}


def run_stack(mocks: RecordingMocks | None = None, **config: Any) -> ProgramRun:
    """One mocked run of the program with BASE_CONFIG plus `config` (gpu: keys, no prefix)."""
    return run_program({**BASE_CONFIG, **config}, stack="test", mocks=mocks)


def training_log_group(run: ProgramRun) -> Recorded:
    """The nodes' log group (the spend guard's function has its own)."""
    (group,) = [r for r in of_type(run, LOG_GROUP) if not r.name.endswith("-spend-guard")]
    return group


def nodes_in_rank_order(run: ProgramRun) -> list[Recorded]:
    return sorted(of_type(run, INSTANCE), key=lambda r: int(r.inputs["tags"]["gpu-node-rank"]))


def boot_files(instance: Recorded) -> dict[str, str]:
    """Path -> content of the files a node's cloud-config writes."""
    user_data = instance.inputs["userData"]
    assert user_data.startswith("#cloud-config\n")
    document = yaml.safe_load(user_data)
    return {item["path"]: written_content(item) for item in document["write_files"]}


def written_content(item: dict) -> str:
    """A write_files entry's file as cloud-init writes it (plain, or gz+b64)."""
    if item.get("encoding") == "gz+b64":
        return gzip.decompress(base64.b64decode(item["content"])).decode()
    return item["content"]


def boot_env(instance: Recorded) -> dict[str, str]:
    """The container environment a node's user data ships."""
    content = boot_files(instance)["/etc/gpu-stack/training.env"]
    return dict(line.split("=", 1) for line in content.splitlines())


def node_policy(run: ProgramRun) -> dict:
    """The instance role's inline policy, parsed from the JSON the role receives."""
    (policy,) = [r for r in of_type(run, ROLE_POLICY) if r.name.endswith("-node")]
    return json.loads(policy.inputs["policy"])


class StableIds(RecordingMocks):
    """IDs from each resource's name, not the order the program registers it in: the same
    subnet, bucket and policy on every run, as in a deployed stack's state."""

    def new_resource(self, args):
        stable = zlib.crc32(f"{args.typ} {args.name}".encode())
        resource_id, computed = self._computed(args.typ, args.name, args.inputs, stable)
        state = {**args.inputs, **computed}
        self.resources.append(
            Recorded(args.typ, args.name, resource_id, dict(args.inputs), args.provider, state)
        )
        return resource_id, state


def cluster_template(stack: str = "test", **config: Any) -> str:
    """The CloudFormation template body the program renders for a cluster stack with
    BASE_CONFIG plus `config`, with the IDs a deployed stack keeps (StableIds)."""
    run = run_program({**BASE_CONFIG, **config}, stack=stack, mocks=StableIds())
    (cluster,) = of_type(run, "aws:cloudformation/stack:Stack")
    return cluster.inputs["templateBody"]
