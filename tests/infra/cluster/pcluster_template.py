"""Synthesize ParallelCluster's own CloudFormation for cluster configs (a YAML list on stdin).

Runs under the interpreter of .venv-pcluster (requirements-pcluster.txt, with moto), not
the project's: `python pcluster_template.py < configs.yaml`. Prints a JSON list: for each
config, {"subnet": the subnet id it was given, "template": the cluster stack,
"nested": [the nested stacks' templates]}.

ParallelCluster's template builder (pcluster.templates.cdk_builder.CDKTemplateBuilder,
aws-parallelcluster 3.15.1) asks AWS about the subnet, the official AMI and the artifacts
bucket; moto answers, in one region with dummy credentials. The official-AMI look-up asks
for Amazon-owned images by name, which moto does not have: it gets one of moto's images.
Each config's subnet id is replaced by a moto subnet in a VPC of the stack's CIDR.
Exit 3 with one line when moto is missing.
"""

import json
import os
import sys

import yaml

try:
    from moto import mock_aws
except ImportError:
    print("moto is not installed in ParallelCluster's virtualenv (requirements-pcluster.txt)")
    sys.exit(3)

CLUSTER_NAME = "gpu-stack-test"


def synthesize(config: dict, boto3) -> dict:
    from pcluster.models.s3_bucket import S3Bucket
    from pcluster.schemas.cluster_schema import ClusterSchema
    from pcluster.templates.cdk_builder import CDKTemplateBuilder

    ec2 = boto3.client("ec2")
    vpc = ec2.create_vpc(CidrBlock=os.environ["VPC_CIDR"])["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock=os.environ["SUBNET_CIDR"])["Subnet"]
    given = config["HeadNode"]["Networking"]["SubnetId"]
    config = json.loads(json.dumps(config).replace(given, subnet["SubnetId"]))
    cluster = ClusterSchema(cluster_name=CLUSTER_NAME).load(config)
    bucket = S3Bucket(service_name=CLUSTER_NAME, stack_name=CLUSTER_NAME, artifact_directory="a")
    boto3.client("s3").create_bucket(Bucket=bucket.name)
    template, assets = CDKTemplateBuilder().build_cluster_template(
        cluster_config=cluster, bucket=bucket, stack_name=CLUSTER_NAME
    )
    # The nested stacks (the queues' launch templates and roles), as uploaded to the bucket.
    nested = [asset["content"] for asset in assets]
    return {"subnet": subnet["SubnetId"], "template": template, "nested": nested}


def main() -> None:
    configs = yaml.safe_load(sys.stdin)
    with mock_aws():
        import boto3
        from pcluster.aws.ec2 import Ec2Client

        image = boto3.client("ec2").describe_images()["Images"][0]["ImageId"]
        Ec2Client.get_official_image_id = lambda self, *args, **kwargs: image
        results = [synthesize(config, boto3) for config in configs]
    json.dump(results, sys.stdout, default=str)


if __name__ == "__main__":
    main()
