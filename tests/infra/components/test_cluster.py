"""gpu:cluster: slurm under mocks: ParallelCluster's custom resource in one CloudFormation stack.

What the stack relies on from AWS, with the public source of each fact:
- ParallelCluster's custom resource: a provider stack whose TemplateURL is the
  region's aws-parallelcluster bucket's custom_resource/cluster.yaml, and a
  `Custom::PclusterCluster` with the provider's ServiceToken output and the cluster
  configuration (https://docs.aws.amazon.com/parallelcluster/latest/ug/cloudformation-v3.html).
- CloudFormation needs CAPABILITY_IAM / CAPABILITY_NAMED_IAM to create the provider's
  roles and CAPABILITY_AUTO_EXPAND for a template with a transform
  (https://docs.aws.amazon.com/AWSCloudFormation/latest/APIReference/API_CreateStack.html).
"""

from __future__ import annotations

import json
import tomllib

import pulumi
import pytest

from infra.cluster.config import SETUP_SCRIPT
from infra.knowledge.parallelcluster import PARALLELCLUSTER_PATH
from tests.support.infra import data_file_head_node
from tests.support.mock_runs import of_type, one
from tests.support.stack_runs import INSTANCE, LAUNCH_TEMPLATE, run_stack

STACK = "aws:cloudformation/stack:Stack"
POLICY = "aws:iam/policy:Policy"
OBJECT = "aws:s3/bucketObjectv2:BucketObjectv2"
REPOSITORY = "aws:ecr/repository:Repository"
BUCKET = "aws:s3/bucket:Bucket"
SUBNET = "aws:ec2/subnet:Subnet"
DATA = tomllib.loads(PARALLELCLUSTER_PATH.read_text())


@pytest.fixture(scope="module")
def run():
    return run_stack(cluster="slurm", nodes=2, spot=True)


def template(run) -> dict:
    return json.loads(one(run, STACK).inputs["templateBody"])


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
    (subnet,) = of_type(run, SUBNET)
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
    job = objects["cluster/train.sbatch"]
    registry, repository = run.outputs["image_uri"].split("/", 1)
    assert f"--container-image={registry}#{repository}" in job
    assert "#SBATCH --nodes=2" in job and "#SBATCH --requeue" in job
    assert f's3_root="{run.outputs["checkpoint_uri"]}"' in job
    # The health gate holds each p4d.24xlarge node to the catalog: 8 A100, 230 GB/s, 4 EFA.
    assert (
        "export TRAIN_EXPECT_GPUS=8\nexport TRAIN_EXPECT_GPU_MODEL=A100\n"
        "export TRAIN_EXPECT_BUSBW_GBPS=230.0\nexport TRAIN_EXPECT_EFA=4\n"
    ) in job


def test_no_ec2_instance_is_launched_outside_the_cluster(run):
    assert of_type(run, INSTANCE) == [] and of_type(run, LAUNCH_TEMPLATE) == []


def test_outputs_name_the_head_node_the_submit_command_the_queue_and_the_idle_cost(run):
    outputs = run.outputs
    assert outputs["queue"] == "gpu"
    assert outputs["head_node"].startswith("i-")
    assert f"--target {outputs['head_node']}" in outputs["submit_command"]
    assert "sbatch" in outputs["submit_command"]
    assert outputs["idle_usd_per_hour"] == data_file_head_node("us-east-1").on_demand_usd_per_hour
    assert outputs["market"] == "SPOT"
    # The commands find the head node and the compute nodes by the tags the cluster passes on.
    assert outputs["cost_tag"] == "gpu-stack=gpu-training-stack-test"
    assert outputs["hourly_cost_usd"] == outputs["spot_usd_per_hour"] > 0  # a spot queue


def test_a_variant_the_clusters_driver_cannot_run_fails_preview():
    with pytest.raises(pulumi.RunError) as caught:
        run_stack(cluster="slurm", nodes=2, imageVariant="cu130", parallelClusterVersion="3.14.0")
    message = str(caught.value)
    assert "ParallelCluster 3.14.0" in message and "570.172.08" in message
    assert "'cu128'" in message


def test_the_idle_cost_is_the_head_nodes_price_in_the_stacks_region():
    ireland = data_file_head_node("eu-west-1").on_demand_usd_per_hour
    assert ireland != data_file_head_node("us-east-1").on_demand_usd_per_hour
    run = run_stack(cluster="slurm", nodes=2, **{"aws:region": "eu-west-1"})
    assert run.outputs["idle_usd_per_hour"] == ireland
