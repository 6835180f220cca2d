"""A Slurm cluster from AWS ParallelCluster, created by `pulumi up` (gpu:cluster: slurm).

ParallelCluster 3.6+ ships a CloudFormation custom resource: a provider stack
(a nested `AWS::CloudFormation::Stack` from the region's aws-parallelcluster
bucket) and a `Custom::PclusterCluster` that takes the provider's ServiceToken
and the cluster configuration
(https://docs.aws.amazon.com/parallelcluster/latest/ug/cloudformation-v3.html,
https://docs.aws.amazon.com/parallelcluster/latest/ug/cfn-cluster-resource.html).
Here both live in one `aws.cloudformation.Stack`: the user installs nothing
beyond what `pulumi up` needs. CloudFormation does not detect drift of the
custom resource, and deleting the stack deletes the cluster (cfn-cluster-ops.html).

Beside it: the nodes' policy (the single-node role's scope: the stack's bucket,
repository and log group), and in the bucket the node setup script and the job
script (infra/cluster/templates), which the head node copies into place at boot and
the submit command copies again, so a new image tag reaches the next job.

Lifecycle facts the stack relies on:
- The provider's Lambda may attach only the node policies whose ARN matches
  `arn:...:policy/parallelcluster*` or `.../policy/parallelcluster/*` (and a short list of
  AWS-managed ones): DefaultParallelClusterIamAdminPolicy, iam:AttachRolePolicy condition,
  in aws-parallelcluster cloudformation/policies/parallelcluster-policies.yaml, tag v3.15.1;
  https://docs.aws.amazon.com/parallelcluster/latest/ug/iam-roles-in-parallelcluster-v3.html.
- terraform-provider-aws waits 30 minutes by default for a CloudFormation stack's create,
  update and delete (internal/service/cloudformation/stack.go, Timeouts, commit
  01606926a0c0ab9174aec440f976a48b0baee722); a cluster takes 20-40 minutes, and its
  CloudFormation timeout is CREATE_TIMEOUT_MINUTES.
- A stack whose create failed sits in ROLLBACK_COMPLETE, which can only be deleted, so the
  next `pulumi up` fails on it; OnFailure DELETE deletes it instead
  (https://docs.aws.amazon.com/AWSCloudFormation/latest/APIReference/API_CreateStack.html,
  OnFailure). The provider records the stack's id before it waits for the create
  (stack.go, resourceStackCreate), so Pulumi keeps the deleted stack in its state; only a
  read (a refresh) drops a DELETE_COMPLETE stack (resourceStackRead, findStackByName), which
  `up` does first (infra/deployed/cluster_update.py).
- `name`, `on_failure` and `timeout_in_minutes` are ForceNew (stack.go, Schema): changing
  one replaces the stack, and a replacement must delete the old stack before it creates
  the new one, whose name is the same.
- The cluster's log group is `/aws/parallelcluster/<cluster name>-<timestamp>`
  (pcluster/templates/cluster_stack.py with CW_LOG_GROUP_NAME_PREFIX, tag v3.15.1).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from common.market import Market
from infra.cluster.config import (
    DEFAULT_USER,
    EPILOG_KEY,
    JOB_SCRIPT_KEY,
    JOB_SCRIPT_ON_HEAD_NODE,
    QUEUE,
    SETUP_SCRIPT,
    ClusterSettings,
    cloudformation_stack_name,
    cluster_config,
    efa_enabled,
)
from infra.cluster.epilog import render_epilog
from infra.cluster.sbatch import (
    CLUSTER_CACHE_DIR,
    CLUSTER_CHECKPOINT_ROOT,
    BatchJob,
    Launch,
    render_sbatch,
)
from infra.components.iam import instance_policy
from infra.components.storage import Storage
from infra.config.schema import S3Uri
from infra.jobs import hf_token
from infra.knowledge.allreduce import node_expectation
from infra.knowledge.parallelcluster import HeadNode
from infra.knowledge.resolver import Plan

SETUP_SCRIPT_KEY = f"cluster/{SETUP_SCRIPT.name}"
# Host folders the job's container sees at the same paths: the node-local scratch
# disk (checkpoints) and the shared /home (configs, the job's output and log).
CONTAINER_MOUNTS = {"/scratch": "/scratch", "/home": "/home"}
# CloudFormation creates the provider's IAM roles and Lambda functions, and the
# provider template uses the Serverless transform (cloudformation-v3.html).
CAPABILITIES = ["CAPABILITY_IAM", "CAPABILITY_NAMED_IAM", "CAPABILITY_AUTO_EXPAND"]
# ParallelCluster creates a cluster in 20-40 minutes; CloudFormation waits for it.
CREATE_TIMEOUT_MINUTES = 90
# Pulumi waits longer than CloudFormation, so CloudFormation's own timeout and rollback
# decide, not a Pulumi error that leaves the stack half made.
STACK_TIMEOUTS = pulumi.CustomTimeouts(create="120m", update="120m", delete="90m")
# The IAM path that puts the node policy inside what the provider may attach (above).
NODE_POLICY_PATH = "/parallelcluster/"
LOG_GROUP_PREFIX = "/aws/parallelcluster/"


@dataclass(frozen=True)
class ClusterArgs:
    plan: Plan  # resolved with a ParallelCluster release (plan.cluster)
    head_node: HeadNode
    subnet_id: pulumi.Input[str]
    # The subnet's route out (NAT gateway, route table, association): the head node's
    # bootstrap calls CloudFormation, EC2 and DynamoDB, and a compute node ECR, through it.
    route_out: list[pulumi.Resource]
    # The stack's bucket (each job mirrors under its checkpoint_uri), repository, log group.
    storage: Storage
    image_uri: pulumi.Input[str]
    region: pulumi.Input[str]
    tags: dict[str, str]
    market: Market
    ssh_allowed_cidr: str  # who may reach the head node's port 22
    capacity_block_id: str | None = None
    data: S3Uri | None = None
    log_retention_days: int = 30
    delete_data_on_destroy: bool = False  # the cluster's log group goes with the stack


def provider_template_url(version: str) -> dict:
    """The custom resource's provider template in the region's aws-parallelcluster bucket."""
    return {
        "Fn::Sub": "https://${AWS::Region}-aws-parallelcluster.s3.${AWS::Region}.${AWS::URLSuffix}"
        f"/parallelcluster/{version}/templates/custom_resource/cluster.yaml"
    }


def cloudformation_template(cluster_name: str, version: str, config: dict) -> dict:
    """The provider stack and the cluster, with the head node's id and address as outputs."""
    return {
        "AWSTemplateFormatVersion": "2010-09-09",
        "Description": f"AWS ParallelCluster {version} Slurm cluster {cluster_name}",
        "Resources": {
            "PclusterClusterProvider": {
                "Type": "AWS::CloudFormation::Stack",
                "Properties": {"TemplateURL": provider_template_url(version)},
            },
            "PclusterCluster": {
                "Type": "Custom::PclusterCluster",
                "Properties": {
                    "ServiceToken": {
                        "Fn::GetAtt": ["PclusterClusterProvider", "Outputs.ServiceToken"]
                    },
                    "ClusterName": cluster_name,
                    "ClusterConfiguration": config,
                },
            },
        },
        # Attributes the custom resource returns (cfn-cluster-resource.html).
        "Outputs": {
            "HeadNodeInstanceId": {
                "Value": {"Fn::GetAtt": ["PclusterCluster", "headNode.instanceId"]}
            },
            "HeadNodePrivateIp": {
                "Value": {"Fn::GetAtt": ["PclusterCluster", "headNode.privateIpAddress"]}
            },
        },
    }


def job_script(
    plan: Plan, image_uri: str, checkpoint_uri: str, *, region: str, stack_resource: str
) -> str:
    """The sbatch the head node gets: the stack's image on every node under Pyxis, its
    health gate holding each node to the catalog's figures for the queue's type, its cache
    on the nodes' scratch disk, the stack's HF_TOKEN secret read at each start."""
    return render_sbatch(
        BatchJob(
            nodes=plan.nodes,
            launch=Launch.container(image_uri, CONTAINER_MOUNTS),
            checkpoint_root=CLUSTER_CHECKPOINT_ROOT,
            s3_root=checkpoint_uri,
            expectation=node_expectation(plan.instance, efa_attached=efa_enabled(plan.instance)),
            cache_dir=CLUSTER_CACHE_DIR,
            hf_token_secret=hf_token.secret_name(stack_resource),
            region=region,
        )
    )


def submit_command(region: str, head_node_id: str, job_script_uri: str) -> str:
    """How a person submits a job: in an SSM session (as ssm-user, a sudoer that exists on
    the head node only), refresh the job script as root (the head node's role may read the
    bucket), then submit as the cluster's default user, who exists on every node, in a
    login shell (`-i`): only the login profile puts /opt/slurm/bin on PATH
    (infra/cluster/control.py)."""
    return (
        f"aws ssm start-session --region {region} --target {head_node_id}, then: "
        f"sudo aws s3 cp --only-show-errors {job_script_uri} {JOB_SCRIPT_ON_HEAD_NODE} && "
        f"sudo -iu {DEFAULT_USER} sbatch --job-name=RUN {JOB_SCRIPT_ON_HEAD_NODE} "
        "--config FILE.toml"
    )


def log_group_prefix(cluster_name: str) -> str:
    return f"{LOG_GROUP_PREFIX}{cluster_name}-"


def _template_body(name: str, args: ClusterArgs, values: dict) -> str:
    """The CloudFormation template, once the values only the deploy knows are known."""
    settings = ClusterSettings(
        region=values["region"],
        subnet_id=values["subnet_id"],
        bucket=values["bucket"],
        setup_script=f"s3://{values['bucket']}/{SETUP_SCRIPT_KEY}",
        job_script=f"s3://{values['bucket']}/{JOB_SCRIPT_KEY}",
        epilog=f"s3://{values['bucket']}/{EPILOG_KEY}",
        node_policy_arn=values["policy_arn"],
        registry=values["image_uri"].split("/", 1)[0],
        head_node=args.head_node,
        ssh_allowed_cidr=args.ssh_allowed_cidr,
        tags=args.tags,
        market=args.market,
        capacity_block_id=args.capacity_block_id,
        log_retention_days=args.log_retention_days,
        delete_logs_on_destroy=args.delete_data_on_destroy,
    )
    config = cluster_config(args.plan, settings)
    return json.dumps(cloudformation_template(name, args.plan.cluster.version, config), indent=2)


def _node_scripts(
    name: str, args: ClusterArgs, opts: pulumi.ResourceOptions
) -> list[aws.s3.BucketObjectv2]:
    """The node setup script, the job script and the Epilog, in the stack's bucket."""
    setup = aws.s3.BucketObjectv2(
        f"{name}-cluster-setup",
        bucket=args.storage.bucket_name,
        key=SETUP_SCRIPT_KEY,
        content=SETUP_SCRIPT.read_text(),
        opts=opts,
    )
    job = aws.s3.BucketObjectv2(
        f"{name}-cluster-job",
        bucket=args.storage.bucket_name,
        key=JOB_SCRIPT_KEY,
        content=pulumi.Output.all(args.image_uri, args.storage.checkpoint_uri, args.region).apply(
            lambda values: job_script(args.plan, *values[:2], region=values[2], stack_resource=name)
        ),
        opts=opts,
    )
    epilog = aws.s3.BucketObjectv2(
        f"{name}-cluster-epilog",
        bucket=args.storage.bucket_name,
        key=EPILOG_KEY,
        content=render_epilog(),
        opts=opts,
    )
    return [setup, job, epilog]


class SlurmCluster(pulumi.ComponentResource):
    """The ParallelCluster cluster (head node + one GPU queue) and what its nodes need."""

    head_node_id: pulumi.Output[str]
    head_node_ip: pulumi.Output[str]
    submit_command: pulumi.Output[str]
    log_group_prefix: str  # the cluster's CloudWatch Logs group starts with it
    queue: str
    market: Market

    def __init__(
        self, name: str, args: ClusterArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("gpu:infra:SlurmCluster", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        plan = args.plan
        release = plan.cluster
        if release is None:
            raise ValueError("SlurmCluster needs a plan resolved for a ParallelCluster release")

        node_policy = aws.iam.Policy(
            f"{name}-cluster-nodes",
            path=NODE_POLICY_PATH,
            description=f"What {name}'s Slurm compute nodes reach: its bucket, image, logs",
            policy=pulumi.Output.all(
                args.storage.bucket_arn, args.storage.repository_arn, args.storage.log_group_arn
            ).apply(
                lambda arns: json.dumps(
                    instance_policy(
                        *arns, data=args.data, hf_token_secret=hf_token.secret_name(name)
                    )
                )
            ),
            opts=child,
        )
        scripts = _node_scripts(name, args, child)
        stack = aws.cloudformation.Stack(
            cloudformation_stack_name(name),
            name=cloudformation_stack_name(name),
            template_body=pulumi.Output.all(
                region=args.region,
                subnet_id=args.subnet_id,
                bucket=args.storage.bucket_name,
                policy_arn=node_policy.arn,
                image_uri=args.image_uri,
            ).apply(lambda values: _template_body(name, args, values)),
            capabilities=CAPABILITIES,
            timeout_in_minutes=CREATE_TIMEOUT_MINUTES,
            on_failure="DELETE",
            # The nodes run the scripts at boot: they must be in the bucket first. And a
            # stack depends on a subnet alone, not on its route out: without these, the
            # cluster may be created while the NAT gateway is still pending (a NAT gateway
            # takes minutes to become available: https://docs.aws.amazon.com/vpc/latest/
            # userguide/nat-gateway-working-with.html), and every bootstrap call times out.
            opts=pulumi.ResourceOptions(
                parent=self,
                depends_on=[*scripts, *args.route_out],
                custom_timeouts=STACK_TIMEOUTS,
                delete_before_replace=True,
            ),
        )

        self.head_node_id = stack.outputs.apply(lambda o: (o or {}).get("HeadNodeInstanceId", ""))
        self.head_node_ip = stack.outputs.apply(lambda o: (o or {}).get("HeadNodePrivateIp", ""))
        self.submit_command = pulumi.Output.all(
            args.region, self.head_node_id, args.storage.bucket_name
        ).apply(lambda values: submit_command(*values[:2], f"s3://{values[2]}/{JOB_SCRIPT_KEY}"))
        self.log_group_prefix = log_group_prefix(name)
        self.queue = QUEUE
        self.market = args.market
        self.register_outputs(
            {
                "head_node_id": self.head_node_id,
                "head_node_ip": self.head_node_ip,
                "submit_command": self.submit_command,
                "queue": self.queue,
            }
        )
