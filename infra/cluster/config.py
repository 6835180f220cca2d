"""The ParallelCluster cluster configuration (a dict, YAML for the custom resource) from a Plan.

Keys and values follow the ParallelCluster 3 configuration reference
(https://docs.aws.amazon.com/parallelcluster/latest/ug/cluster-configuration-file-v3.html,
sections HeadNode, Scheduling, Monitoring, Tags); tests/infra/cluster/test_config.py
loads every profile's config with ParallelCluster's own schema (`ClusterSchema`).

Pure Python: the Pulumi component (infra/components/cluster.py) renders it once
the subnet, bucket and policy are known; `python -m infra plan` shows it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from common.market import Market
from infra.errors import ConfigError
from infra.functions.slurm_queue import KILL_WAIT_S
from infra.knowledge.catalog import Instance
from infra.knowledge.parallelcluster import HeadNode
from infra.knowledge.resolver import Plan
from training.contract import ExitCode

QUEUE = "gpu"
# Run by ParallelCluster on each node once configured (CustomActions, OnNodeConfigured).
SETUP_SCRIPT = Path(__file__).parent / "templates" / "setup-node.sh"
SCRATCH_DIR = "/scratch"  # compute nodes' instance store (or root volume), node-local
# The user name ECR's registry takes with the token of `aws ecr get-login-password` ("the
# username is AWS": https://docs.aws.amazon.com/AmazonECR/latest/userguide/
# registry_auth.html). The node setup writes it into Enroot's credentials file and the job
# script names it in the image URI (infra/cluster/sbatch.py says why both).
ECR_LOGIN = "AWS"
# A folder on each compute node where a job leaves its verdict on the node (a failed health
# gate) for the Epilog, which drains the node as root (infra/cluster/epilog.py). Sticky and
# writable by all, not listable: a user makes files in it, and removes only their own.
NODE_VERDICTS_DIR = "/var/spool/gpu-stack/node-verdicts"
# Official AMIs carry Pyxis and Enroot (since 3.11.0); the setup script turns them on.
OS = "ubuntu2204"
# The OS's default user, who exists on every node (ParallelCluster's OS_MAPPING,
# aws-parallelcluster cli/src/pcluster/constants.py, tag v3.15.1: ubuntu2204 -> ubuntu).
# Jobs are submitted as this user: Slurm runs a job as its submitter on the compute
# nodes, where SSM's ssm-user does not exist.
DEFAULT_USER = "ubuntu"
# The batch script every job runs: in the stack's bucket, and copied to the head node.
JOB_SCRIPT_KEY = "cluster/train.sbatch"
JOB_SCRIPT_ON_HEAD_NODE = "/opt/gpu-stack/train.sbatch"
# The Epilog (infra/cluster/epilog.py): in the bucket, and copied by the head node's setup
# into the folder of Epilog scripts every node's slurmd runs (shared /opt/slurm).
EPILOG_KEY = "cluster/node-verdicts.epilog"
# Slurm requeues a batch job that exits with one of these (slurm.conf(5), RequeueExit,
# https://slurm.schedmd.com/slurm.conf.html): the trainer's "interrupted and
# checkpointed" (docs/contracts.md, section 3).
REQUEUE_EXIT = int(ExitCode.INTERRUPTED)
# KILL_WAIT_S (infra/functions/slurm_queue.py, where the spend guard reads it too) is the
# cluster's KillWait: not on ParallelCluster's deny list for CustomSlurmSettings (pcluster's
# slurm_settings_validator).
# ParallelCluster's default (Scheduling-v3.html, SlurmSettings): idle dynamic nodes are
# terminated after this many minutes, so the queue costs nothing between jobs.
SCALEDOWN_IDLE_MINUTES = 10
SSM_POLICY = "arn:aws:iam::aws:policy/AmazonSSMManagedInstanceCore"
# How a `pulumi up` that changes the queue (instance type, capacity type, custom actions,
# a lower MaxCount) is applied: without a strategy ParallelCluster refuses such an update
# unless the fleet is stopped (default COMPUTE_FLEET_STOP), and the custom resource does
# not stop it (https://docs.aws.amazon.com/parallelcluster/latest/ug/cfn-cluster-ops.html;
# Scheduling-v3.html, QueueUpdateStrategy). DRAIN: nodes finish their running job, then
# are replaced; no running job is killed.
QUEUE_UPDATE_STRATEGY = "DRAIN"


@dataclass(frozen=True)
class ClusterSettings:
    """What the stack knows about where the cluster lives (resolved by the Pulumi program)."""

    region: str
    subnet_id: str
    bucket: str  # the stack's bucket: checkpoints, data, the setup script and sbatch
    setup_script: str  # s3:// URI of templates/setup-node.sh in the bucket
    job_script: str  # s3:// URI of the rendered train.sbatch, copied onto the head node
    epilog: str  # s3:// URI of the rendered Epilog, installed by the head node's setup
    node_policy_arn: str  # the stack's scoped policy: ECR pull of its repository
    registry: str  # the ECR registry host Enroot pulls the image from
    head_node: HeadNode
    # Who may reach the head node's port 22 (HeadNode.Ssh.AllowedIps): gpu:sshCidr, else
    # the VPC only. Unset, ParallelCluster opens it to 0.0.0.0/0 (HeadNodeSsh's default
    # CIDR_ALL_IPS, pcluster/config/cluster_config.py, tag v3.15.1).
    ssh_allowed_cidr: str
    tags: dict[str, str] = field(default_factory=dict)
    market: Market = Market.ON_DEMAND
    capacity_block_id: str | None = None  # the EC2 Capacity Block of Market.CAPACITY_BLOCK
    log_retention_days: int = 30
    # gpu:deleteDataOnDestroy: the cluster's log group goes with the stack, else it stays.
    delete_logs_on_destroy: bool = False


# ParallelCluster's rule for a cluster name: a letter, then letters, digits and hyphens, 60
# characters at most (aws-parallelcluster v3.15.1, cli/src/pcluster/constants.py:
# PCLUSTER_NAME_REGEX, PCLUSTER_NAME_MAX_LENGTH; validators/cluster_validators.py,
# ClusterNameValidator). A name it refuses fails the create minutes in, inside the custom
# resource; here it fails the preview.
CLUSTER_NAME_MAX_LENGTH = 60
CLUSTER_NAME = re.compile(rf"[a-zA-Z][a-zA-Z0-9-]{{0,{CLUSTER_NAME_MAX_LENGTH - 1}}}")


def check_cluster_name(name: str, stack: str) -> None:
    """ConfigError, before anything is created, for a stack whose cluster name (the stack's
    resource name, `<project>-<stack>`) ParallelCluster would refuse."""
    if not CLUSTER_NAME.fullmatch(name):
        raise ConfigError(
            f"stack name {stack!r} makes the Slurm cluster's name {name!r}, which "
            "ParallelCluster refuses: a cluster name is a letter, then letters, digits and "
            f"'-', {CLUSTER_NAME_MAX_LENGTH} characters at most; rename the stack file "
            "(no '_' or '.')"
        )


def cloudformation_stack_name(cluster_name: str) -> str:
    """The CloudFormation stack (and its Pulumi resource) that holds the cluster."""
    return f"{cluster_name}-cluster"


def compute_resource_name(instance_type: str) -> str:
    """p4d.24xlarge -> p4d-24xlarge (names allow letters, digits and hyphens)."""
    return instance_type.replace(".", "-")


# The queue's CapacityType for each market (Scheduling-v3.html, SlurmQueues, CapacityType:
# ONDEMAND, SPOT or CAPACITY_BLOCK). A capacity reservation's instances are on-demand ones.
CAPACITY_TYPES = {
    Market.ON_DEMAND: "ONDEMAND",
    Market.SPOT: "SPOT",
    Market.CAPACITY_BLOCK: "CAPACITY_BLOCK",
    Market.RESERVATION: "ONDEMAND",
}


def cluster_config(plan: Plan, settings: ClusterSettings) -> dict:
    """The whole cluster configuration for `plan` (its instance type, node limit, image)."""
    if plan.cluster is None:
        raise ConfigError("the plan was resolved without a ParallelCluster release")
    return {
        "Region": settings.region,
        "Image": {"Os": OS},
        "HeadNode": _head_node(settings),
        "Scheduling": {
            "Scheduler": "slurm",
            "SlurmSettings": {
                "ScaledownIdletime": SCALEDOWN_IDLE_MINUTES,
                "QueueUpdateStrategy": QUEUE_UPDATE_STRATEGY,
                "CustomSlurmSettings": [
                    {"RequeueExit": str(REQUEUE_EXIT)},
                    {"KillWait": str(KILL_WAIT_S)},
                ],
            },
            "SlurmQueues": [_gpu_queue(plan, settings)],
        },
        "Monitoring": {
            "Logs": {
                "CloudWatch": {
                    "Enabled": True,
                    "RetentionInDays": settings.log_retention_days,
                    # Retain is ParallelCluster's default (Monitoring-v3.html, DeletionPolicy).
                    "DeletionPolicy": "Delete" if settings.delete_logs_on_destroy else "Retain",
                }
            }
        },
        "Tags": [{"Key": key, "Value": value} for key, value in sorted(settings.tags.items())],
    }


def _head_node(settings: ClusterSettings) -> dict:
    """A small on-demand instance: slurmctld and ParallelCluster's daemons, no training."""
    return {
        "InstanceType": settings.head_node.instance_type,
        # A private subnet: the way out is the stack's NAT gateway (infra/components/network.py).
        "Networking": {"SubnetId": settings.subnet_id},
        # No SSH key: people reach the head node through SSM Session Manager.
        "Ssh": {"AllowedIps": settings.ssh_allowed_cidr},
        "Iam": {
            "AdditionalIamPolicies": [{"Policy": SSM_POLICY}],
            "S3Access": [{"BucketName": settings.bucket, "EnableWriteAccess": False}],
        },
        "CustomActions": {
            "OnNodeConfigured": {
                "Script": settings.setup_script,
                "Args": ["head", settings.job_script, settings.epilog],
            }
        },
    }


def _gpu_queue(plan: Plan, settings: ClusterSettings) -> dict:
    instance = plan.instance
    resource: dict = {
        "Name": compute_resource_name(instance.type),
        "InstanceType": instance.type,
        # Dynamic nodes only: the queue scales to zero and back (MinCount 0).
        "MinCount": 0,
        "MaxCount": plan.nodes,
    }
    block = settings.market is Market.CAPACITY_BLOCK
    if block:
        # A Capacity Block's nodes are static: MinCount = MaxCount > 0, and the
        # reservation is named (pcluster's SlurmComputeResourceSizeValidator).
        resource["MinCount"] = plan.nodes
        resource["CapacityReservationTarget"] = {
            "CapacityReservationId": settings.capacity_block_id
        }
    if efa_enabled(instance):
        resource["Efa"] = {"Enabled": True, "GdrSupport": True}
    networking: dict = {"SubnetIds": [settings.subnet_id]}
    if not block:
        # A Capacity Block brings its own placement; otherwise nodes of one job sit close.
        networking["PlacementGroup"] = {"Enabled": True}
    return {
        "Name": QUEUE,
        "CapacityType": CAPACITY_TYPES[settings.market],
        "Networking": networking,
        "ComputeResources": [resource],
        # nvidia-smi/DCGM checks before a job runs on a node (HealthChecks.Gpu).
        "HealthChecks": {"Gpu": {"Enabled": True}},
        "ComputeSettings": {"LocalStorage": {"EphemeralVolume": {"MountDir": SCRATCH_DIR}}},
        "Iam": {
            "AdditionalIamPolicies": [{"Policy": settings.node_policy_arn}],
            # Read: the setup script. Checkpoints and data are the node policy's (the
            # single-node role's scope, infra/components/iam.py).
            "S3Access": [{"BucketName": settings.bucket, "EnableWriteAccess": False}],
        },
        "CustomActions": {
            "OnNodeConfigured": {
                "Script": settings.setup_script,
                "Args": [
                    "compute",
                    settings.registry,
                    settings.region,
                    ECR_LOGIN,
                    NODE_VERDICTS_DIR,
                ],
            }
        },
    }


def efa_enabled(instance: Instance) -> bool:
    """GPUDirect RDMA over EFA on the queue's nodes where the type has EFA (Scheduling-v3.html,
    Efa); the health gate then expects every interface."""
    return instance.efa_interfaces > 0
