"""gpu:cluster: slurm under mocks: ParallelCluster's custom resource in one CloudFormation stack.

What the stack relies on from AWS, with the public source of each fact:
- ParallelCluster's custom resource: a provider stack whose TemplateURL is the
  region's aws-parallelcluster bucket's custom_resource/cluster.yaml, and a
  `Custom::PclusterCluster` with the provider's ServiceToken output and the cluster
  configuration (https://docs.aws.amazon.com/parallelcluster/latest/ug/cloudformation-v3.html).
- CloudFormation needs CAPABILITY_IAM / CAPABILITY_NAMED_IAM to create the provider's
  roles and CAPABILITY_AUTO_EXPAND for a template with a transform
  (https://docs.aws.amazon.com/AWSCloudFormation/latest/APIReference/API_CreateStack.html).
- The provider's Lambda attaches only policies whose ARN is ArnLike
  `arn:aws:iam::ACCOUNT:policy/parallelcluster*` or `.../policy/parallelcluster/*`
  (aws-parallelcluster cloudformation/policies/parallelcluster-policies.yaml, tag v3.15.1);
  an IAM policy's ARN is `arn:aws:iam::ACCOUNT:policy` + its path + its name
  (https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_identifiers.html).
"""

from __future__ import annotations

import fnmatch
import json
import tomllib

import pulumi
import pulumi_aws as aws
import pytest
import yaml

from infra.cluster.config import SETUP_SCRIPT
from infra.cluster.epilog import render_epilog
from infra.dryrun.runner import run_program
from infra.knowledge.parallelcluster import PARALLELCLUSTER_PATH
from tests.support.infra import data_file_cluster_idle_usd_per_hour
from tests.support.mock_runs import of_type, one
from tests.support.stack_runs import BASE_CONFIG, INSTANCE, LAUNCH_TEMPLATE, run_stack
from tests.training.multirank import REPO_ROOT

STACK = "aws:cloudformation/stack:Stack"
POLICY = "aws:iam/policy:Policy"
OBJECT = "aws:s3/bucketObjectv2:BucketObjectv2"
REPOSITORY = "aws:ecr/repository:Repository"
BUCKET = "aws:s3/bucket:Bucket"
SUBNET = "aws:ec2/subnet:Subnet"
ROUTE_TABLE = "aws:ec2/routeTable:RouteTable"
ASSOCIATION = "aws:ec2/routeTableAssociation:RouteTableAssociation"
NAT_GATEWAY = "aws:ec2/natGateway:NatGateway"
ENDPOINT = "aws:ec2/vpcEndpoint:VpcEndpoint"
GATEWAY = "aws:ec2/internetGateway:InternetGateway"
# What the provider's role may attach (parallelcluster-policies.yaml, iam:PolicyARN ArnLike).
ATTACHABLE = (
    "arn:aws:iam::{account}:policy/parallelcluster*",
    "arn:aws:iam::{account}:policy/parallelcluster/*",
)
DATA = tomllib.loads(PARALLELCLUSTER_PATH.read_text())


@pytest.fixture(scope="module")
def run():
    return run_stack(cluster="slurm", nodes=2, spot=True)


def template(run) -> dict:
    return json.loads(one(run, STACK).inputs["templateBody"])


def cluster_config(run) -> dict:
    return template(run)["Resources"]["PclusterCluster"]["Properties"]["ClusterConfiguration"]


def subnet_named(run, suffix: str):
    (subnet,) = [s for s in of_type(run, SUBNET) if s.name.endswith(suffix)]
    return subnet


def route_out(run, subnet) -> dict:
    """The 0.0.0.0/0 route of the route table associated with `subnet`."""
    (association,) = [a for a in of_type(run, ASSOCIATION) if a.inputs["subnetId"] == subnet.id]
    (table,) = [t for t in of_type(run, ROUTE_TABLE) if t.id == association.inputs["routeTableId"]]
    (route,) = [r for r in table.inputs["routes"] if r["cidrBlock"] == "0.0.0.0/0"]
    return route


def attachable_by_the_provider(policy_arn: str, account: str) -> bool:
    return any(fnmatch.fnmatchcase(policy_arn, p.format(account=account)) for p in ATTACHABLE)


def assert_the_cluster_can_be_created(run) -> None:
    """The bars of a first real `pulumi up`: attachable node policy, a route out for the head
    node and the compute nodes, no SSH from anywhere, timeouts, a queue update strategy."""
    (policy,) = of_type(run, POLICY)
    account = policy.state["arn"].split(":")[4]
    # The ARN AWS gives the policy: its path and name (the mock's ARN ignores the path).
    # Pulumi names it after the resource, plus a random suffix.
    name = policy.inputs.get("name") or f"{policy.name}-1a2b3c4"
    arn = f"arn:aws:iam::{account}:policy{policy.inputs['path']}{name}"
    assert attachable_by_the_provider(arn, account), arn
    config = cluster_config(run)
    private = subnet_named(run, "-private")
    assert config["HeadNode"]["Networking"]["SubnetId"] == private.id
    assert config["Scheduling"]["SlurmQueues"][0]["Networking"]["SubnetIds"] == [private.id]
    (nat,) = of_type(run, NAT_GATEWAY)
    assert route_out(run, private) == {"cidrBlock": "0.0.0.0/0", "natGatewayId": nat.id}
    public = subnet_named(run, "-public")
    assert nat.inputs["subnetId"] == public.id
    (gateway,) = of_type(run, GATEWAY)
    assert route_out(run, public) == {"cidrBlock": "0.0.0.0/0", "gatewayId": gateway.id}
    assert config["HeadNode"]["Ssh"]["AllowedIps"] != "0.0.0.0/0"
    stack = one(run, STACK)
    assert stack.inputs["onFailure"] == "DELETE"
    assert config["Scheduling"]["SlurmSettings"]["QueueUpdateStrategy"] == "DRAIN"
    assert_the_cluster_waits_for_its_route_out(run, private, nat)


def assert_the_cluster_waits_for_its_route_out(run, private, nat) -> None:
    """The CloudFormation stack is created after the NAT gateway, the private route table and
    the table's association with the nodes' subnet, not only after the subnet."""
    (association,) = [a for a in of_type(run, ASSOCIATION) if a.inputs["subnetId"] == private.id]
    (table,) = [t for t in of_type(run, ROUTE_TABLE) if t.id == association.inputs["routeTableId"]]
    waits = set(run.depends_on[f"{STACK} {one(run, STACK).name}"])
    assert {nat.name, table.name, association.name} <= waits, waits


def test_one_cloudformation_stack_holds_the_provider_and_the_cluster(run):
    resources = template(run)["Resources"]
    version = DATA["default"]
    provider = resources["PclusterClusterProvider"]
    assert provider["Type"] == "AWS::CloudFormation::Stack"
    assert provider["Properties"]["TemplateURL"] == {
        "Fn::Sub": "https://${AWS::Region}-aws-parallelcluster.s3.${AWS::Region}.${AWS::URLSuffix}"
        f"/parallelcluster/{version}/templates/custom_resource/cluster.yaml"
    }
    cluster = resources["PclusterCluster"]
    assert cluster["Type"] == "Custom::PclusterCluster"
    assert cluster["Properties"]["ServiceToken"] == {
        "Fn::GetAtt": ["PclusterClusterProvider", "Outputs.ServiceToken"]
    }
    assert cluster["Properties"]["ClusterName"] == "gpu-training-stack-test"
    capabilities = set(one(run, STACK).inputs["capabilities"])
    assert {"CAPABILITY_NAMED_IAM", "CAPABILITY_AUTO_EXPAND"} <= capabilities


def test_the_cluster_config_is_the_plans_queue_in_the_stacks_subnet_and_tags(run):
    config = template(run)["Resources"]["PclusterCluster"]["Properties"]["ClusterConfiguration"]
    (queue,) = config["Scheduling"]["SlurmQueues"]
    (resource,) = queue["ComputeResources"]
    assert resource["InstanceType"] == "p4d.24xlarge"  # the default profile a100x8
    assert (resource["MinCount"], resource["MaxCount"]) == (0, 2)
    assert queue["CapacityType"] == "SPOT"
    subnet = subnet_named(run, "-private")
    assert queue["Networking"]["SubnetIds"] == [subnet.id]
    assert config["HeadNode"]["Networking"]["SubnetId"] == subnet.id
    assert config["HeadNode"]["InstanceType"] == DATA["head_node"]["instance_type"]
    assert {"Key": "gpu-stack", "Value": "gpu-training-stack-test"} in config["Tags"]
    assert config["Scheduling"]["SlurmSettings"]["CustomSlurmSettings"] == [
        {"RequeueExit": "75"},
        {"KillWait": "120"},
    ]


def test_the_nodes_policy_reaches_only_the_stacks_bucket_and_repository(run):
    (policy,) = of_type(run, POLICY)
    document = json.loads(policy.inputs["policy"])
    (repository,) = of_type(run, REPOSITORY)
    (bucket,) = of_type(run, BUCKET)
    by_sid = {s["Sid"]: s for s in document["Statement"]}
    assert by_sid["PullTrainingImage"]["Resource"] == [repository.state["arn"]]
    assert by_sid["CheckpointObjects"]["Resource"] == [f"{bucket.state['arn']}/*"]
    queue = template(run)["Resources"]["PclusterCluster"]["Properties"]["ClusterConfiguration"][
        "Scheduling"
    ]["SlurmQueues"][0]
    assert queue["Iam"]["AdditionalIamPolicies"] == [{"Policy": policy.state["arn"]}]


def test_the_bucket_carries_the_setup_script_and_the_job_script_in_the_image(run):
    objects = {o.inputs["key"]: o.inputs["content"] for o in of_type(run, OBJECT)}
    assert objects["cluster/setup-node.sh"] == SETUP_SCRIPT.read_text()
    assert objects["cluster/node-verdicts.epilog"] == render_epilog()
    job = objects["cluster/train.sbatch"]
    registry, repository = run.outputs["image_uri"].split("/", 1)
    # ECR's user, which the node's Enroot credentials name (test_setup_node.py).
    assert f"--container-image=AWS@{registry}#{repository}" in job
    assert "#SBATCH --nodes=2" in job and "#SBATCH --requeue" in job
    assert f's3_root="{run.outputs["checkpoint_uri"]}"' in job
    # The health gate holds each p4d.24xlarge node to the catalog: 8 A100, 230 GB/s, 4 EFA;
    # the fabric check, the nodes together to 76 GB/s over EFA.
    assert (
        "export TRAIN_EXPECT_GPUS=8\nexport TRAIN_EXPECT_GPU_MODEL=A100\n"
        "export TRAIN_EXPECT_BUSBW_GBPS=230.0\nexport TRAIN_EXPECT_EFA=4\n"
        "export TRAIN_EXPECT_FABRIC_BUSBW_GBPS=76.0\n"
    ) in job


def test_no_ec2_instance_is_launched_outside_the_cluster(run):
    assert of_type(run, INSTANCE) == [] and of_type(run, LAUNCH_TEMPLATE) == []


def test_outputs_name_the_head_node_the_submit_command_the_queue_and_the_idle_cost(run):
    outputs = run.outputs
    assert outputs["queue"] == "gpu"
    assert outputs["head_node"].startswith("i-")
    assert f"--target {outputs['head_node']}" in outputs["submit_command"]
    assert "sbatch" in outputs["submit_command"]
    # m5.large $0.096/h, a NAT gateway $0.045/h and its address $0.005/h (us-east-1).
    assert outputs["idle_usd_per_hour"] == pytest.approx(0.146)
    assert outputs["market"] == "spot"  # the stack's Market, as an EC2 stack writes it
    # The commands find the head node and the compute nodes by the tags the cluster passes on.
    assert outputs["cost_tag"] == "gpu-stack=gpu-training-stack-test"
    assert outputs["hourly_cost_usd"] == outputs["spot_usd_per_hour"] > 0  # a spot queue


def test_a_variant_the_clusters_driver_cannot_run_fails_preview():
    with pytest.raises(pulumi.RunError) as caught:
        run_stack(cluster="slurm", nodes=2, imageVariant="cu130", parallelClusterVersion="3.14.0")
    message = str(caught.value)
    assert "ParallelCluster 3.14.0" in message and "570.172.08" in message
    assert "'cu128'" in message


def test_the_idle_cost_is_the_head_node_and_its_nat_gateway_in_the_stacks_region():
    ireland = data_file_cluster_idle_usd_per_hour("eu-west-1")
    assert ireland != data_file_cluster_idle_usd_per_hour("us-east-1")
    run = run_stack(cluster="slurm", nodes=2, **{"aws:region": "eu-west-1"})
    assert run.outputs["idle_usd_per_hour"] == pytest.approx(ireland)


def test_the_provider_may_attach_the_node_policy_and_would_refuse_it_without_its_path(run):
    (policy,) = of_type(run, POLICY)
    assert policy.inputs["path"] == "/parallelcluster/"
    account = policy.state["arn"].split(":")[4]
    assert not attachable_by_the_provider(
        f"arn:aws:iam::{account}:policy/{policy.name}-1a2b3c4", account
    )
    assert_the_cluster_can_be_created(run)


def test_the_cluster_lives_in_a_private_subnet_whose_way_out_is_a_nat_gateway(run):
    private = subnet_named(run, "-private")
    assert private.inputs["cidrBlock"] == "10.42.16.0/20"
    assert private.inputs["mapPublicIpOnLaunch"] is False
    (nat,) = of_type(run, NAT_GATEWAY)
    assert route_out(run, private)["natGatewayId"] == nat.id
    # Image layers and checkpoints go through the free S3 endpoint, from both subnets.
    (endpoint,) = of_type(run, ENDPOINT)
    tables = {t.id for t in of_type(run, ROUTE_TABLE)}
    assert len(tables) == 2 and set(endpoint.inputs["routeTableIds"]) == tables
    assert endpoint.inputs["vpcEndpointType"] == "Gateway"


def test_the_single_node_stack_keeps_its_network_without_a_nat_gateway():
    single = run_stack()
    assert of_type(single, NAT_GATEWAY) == []
    (subnet,) = of_type(single, SUBNET)
    assert subnet.name.endswith("-public")


def test_ssh_to_the_head_node_is_from_the_vpc_or_from_gpu_ssh_cidr_only(run):
    assert cluster_config(run)["HeadNode"]["Ssh"] == {"AllowedIps": "10.42.0.0/16"}
    limited = run_stack(cluster="slurm", nodes=2, sshCidr="203.0.113.0/24")
    assert cluster_config(limited)["HeadNode"]["Ssh"] == {"AllowedIps": "203.0.113.0/24"}


def test_pulumi_waits_longer_than_cloudformation_and_a_failed_create_is_deleted(monkeypatch):
    seen = []
    original = aws.cloudformation.Stack

    def recording(*args, **kwargs):
        seen.append(kwargs["opts"])
        return original(*args, **kwargs)

    monkeypatch.setattr(aws.cloudformation, "Stack", recording)
    run = run_stack(cluster="slurm", nodes=2)
    stack = one(run, STACK)
    assert stack.inputs["timeoutInMinutes"] == 90
    assert stack.inputs["onFailure"] == "DELETE"  # no ROLLBACK_COMPLETE left behind
    (opts,) = seen
    timeouts = opts.custom_timeouts
    # terraform-provider-aws waits 30 minutes by default; a cluster takes 20-40.
    assert (timeouts.create, timeouts.update, timeouts.delete) == ("120m", "120m", "90m")
    # The stack's name is fixed: a replacement deletes the old one first.
    assert opts.delete_before_replace is True


def test_a_queue_change_drains_the_nodes_instead_of_failing_the_update(run):
    assert cluster_config(run)["Scheduling"]["SlurmSettings"]["QueueUpdateStrategy"] == "DRAIN"


def test_the_clusters_log_group_is_kept_or_deleted_as_gpu_delete_data_on_destroy_says(run):
    logs = cluster_config(run)["Monitoring"]["Logs"]["CloudWatch"]
    assert logs["DeletionPolicy"] == "Retain"
    prefix = "/aws/parallelcluster/gpu-training-stack-test-"
    assert run.outputs["cluster_log_group_prefix"] == prefix
    assert f"{prefix}*" in run.outputs["kept_on_destroy"]
    deleting = run_stack(cluster="slurm", nodes=2, deleteDataOnDestroy=True)
    assert cluster_config(deleting)["Monitoring"]["Logs"]["CloudWatch"]["DeletionPolicy"] == (
        "Delete"
    )
    assert deleting.outputs["kept_on_destroy"] == []


def test_jobs_are_submitted_as_the_default_user_with_the_job_script_fetched_first(run):
    command = run.outputs["submit_command"]
    bucket = run.outputs["checkpoint_bucket"]
    fetch = f"sudo aws s3 cp --only-show-errors s3://{bucket}/cluster/train.sbatch "
    submit = "sudo -iu ubuntu sbatch --job-name=RUN /opt/gpu-stack/train.sbatch"
    assert fetch in command and submit in command
    assert command.index(fetch) < command.index(submit)


def test_the_scripts_the_nodes_run_at_boot_are_in_the_bucket_before_the_cluster(run):
    waits = set(run.depends_on[f"{STACK} {one(run, STACK).name}"])
    assert {o.name for o in of_type(run, OBJECT)} <= waits


@pytest.mark.parametrize(
    ("stack", "accepted"),
    [
        ("l4_x1", False),  # ParallelCluster's cluster names have no '_' ...
        ("l4.x1", False),  # ... nor '.', which Pulumi's stack names allow
        ("a" * 42, False),  # gpu-training-stack- (19) + 42: 61 characters, one too many
        ("a" * 41, True),
        ("l4x1-2", True),
    ],
)
def test_a_stack_name_parallelcluster_refuses_as_a_cluster_name_fails_the_preview(stack, accepted):
    config = {**BASE_CONFIG, "cluster": "slurm", "nodes": 2}
    if accepted:
        run = run_program(config, stack=stack)
        assert cluster_config(run) and one(run, STACK)
        return
    with pytest.raises(pulumi.RunError) as caught:
        run_program(config, stack=stack)
    assert f"stack name {stack!r} makes the Slurm cluster's name" in str(caught.value)
    assert "ParallelCluster refuses" in str(caught.value)


def test_a_cluster_in_the_default_vpc_is_refused_before_any_resource():
    with pytest.raises(pulumi.RunError) as caught:
        run_stack(cluster="slurm", nodes=2, useDefaultVpc=True)
    assert "gpu:useDefaultVpc is true, but a Slurm cluster needs" in str(caught.value)


@pytest.mark.parametrize(
    "path", sorted(REPO_ROOT.glob("Pulumi.*.yaml")), ids=lambda path: path.name
)
def test_every_stack_file_made_a_two_node_cluster_can_be_created(path):
    config = {
        key.removeprefix("gpu:"): value
        for key, value in yaml.safe_load(path.read_text())["config"].items()
    }
    config.update(cluster="slurm", nodes=2)
    # Its job is sized for the file's own nodes; a cluster's job brings its own (--config).
    config.pop("trainConfig", None)
    assert_the_cluster_can_be_created(run_stack(**config))
