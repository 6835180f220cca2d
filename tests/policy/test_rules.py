import pytest
from pulumi_policy.proxy import UNKNOWN_STRING_VALUE, unknown_checking_proxy

from policy import rules
from policy.rules import StackResource

SAFE_LAUNCH_TEMPLATE = {
    "instanceType": "p4d.24xlarge",
    "metadataOptions": {"httpTokens": "required", "httpPutResponseHopLimit": 2},
    "blockDeviceMappings": [
        {"deviceName": "/dev/xvda", "ebs": {"encrypted": "true", "volumeSize": 500}},
        {"deviceName": "/dev/sdb", "virtualName": "ephemeral0"},  # instance store: no EBS
    ],
}
CATALOG_TYPES = rules.catalog_instance_types()


def test_catalog_types_are_the_default_allowed_list():
    assert {"p3.2xlarge", "g6e.12xlarge", "p4d.24xlarge", "p4de.24xlarge"} <= set(CATALOG_TYPES)
    assert all(rules.is_gpu_instance_type(instance_type) for instance_type in CATALOG_TYPES)
    assert not rules.is_gpu_instance_type("t3.micro")
    assert not rules.is_gpu_instance_type(None)


@pytest.mark.parametrize(
    "props",
    [
        {"instanceType": "p4d.24xlarge", "metadataOptions": {"httpTokens": "required"}},
        {"launchTemplate": {"id": "lt-1", "version": "$Latest"}},  # the template is checked
    ],
)
def test_imdsv2_compliant_instances(props):
    assert rules.check_imdsv2(rules.INSTANCE, props) == []


def test_imdsv2_compliant_launch_template():
    assert rules.check_imdsv2(rules.LAUNCH_TEMPLATE, SAFE_LAUNCH_TEMPLATE) == []


@pytest.mark.parametrize(
    ("resource_type", "props", "message"),
    [
        (
            rules.INSTANCE,
            {"instanceType": "p4d.24xlarge", "metadataOptions": {"httpTokens": "optional"}},
            "instance does not require IMDSv2 (metadataOptions.httpTokens is optional): "
            'set it to "required"',
        ),
        (
            rules.INSTANCE,
            {"instanceType": "p4d.24xlarge"},
            "instance does not require IMDSv2 (metadataOptions.httpTokens is unset)",
        ),
        (
            rules.INSTANCE,  # a template does not excuse an explicit opt-out
            {"launchTemplate": {"id": "lt-1"}, "metadataOptions": {"httpTokens": "optional"}},
            "instance does not require IMDSv2 (metadataOptions.httpTokens is optional)",
        ),
        (
            rules.LAUNCH_TEMPLATE,
            {"instanceType": "p4d.24xlarge"},
            "launch template does not require IMDSv2 (metadataOptions.httpTokens is unset)",
        ),
        (
            rules.SPOT_INSTANCE_REQUEST,
            {"metadataOptions": {"httpTokens": UNKNOWN_STRING_VALUE}},
            "instance does not require IMDSv2 (metadataOptions.httpTokens is unset)",
        ),
    ],
)
def test_imdsv2_violations(resource_type, props, message):
    (violation,) = rules.check_imdsv2(resource_type, unknown_checking_proxy(props))
    assert violation.startswith(message)


def test_encrypted_volumes_pass():
    assert rules.check_volume_encryption(rules.LAUNCH_TEMPLATE, SAFE_LAUNCH_TEMPLATE) == []
    assert rules.check_volume_encryption(rules.EBS_VOLUME, {"encrypted": True, "size": 100}) == []
    instance = {"rootBlockDevice": {"encrypted": True}, "ebsBlockDevices": [{"encrypted": True}]}
    assert rules.check_volume_encryption(rules.INSTANCE, instance) == []


@pytest.mark.parametrize(
    ("resource_type", "props", "messages"),
    [
        (
            rules.LAUNCH_TEMPLATE,
            {
                "blockDeviceMappings": [
                    {"deviceName": "/dev/xvda", "ebs": {"encrypted": "false"}},
                    {"deviceName": "/dev/xvdb", "ebs": {"volumeSize": 100}},
                ]
            },
            [
                f"launch template block device {device} is not encrypted: "
                'set ebs.encrypted to "true"'
                for device in ("/dev/xvda", "/dev/xvdb")
            ],
        ),
        (rules.EBS_VOLUME, {"size": 100}, ["EBS volume is not encrypted: set encrypted to true"]),
        (
            rules.EBS_VOLUME,
            {"encrypted": False},
            ["EBS volume is not encrypted: set encrypted to true"],
        ),
        (
            rules.INSTANCE,
            {
                "rootBlockDevice": {"volumeSize": 500},
                "ebsBlockDevices": [{"deviceName": "/dev/sdf", "encrypted": False}],
            },
            [
                "instance root volume is not encrypted: set rootBlockDevice.encrypted to true",
                "instance volume /dev/sdf is not encrypted: "
                "set encrypted to true in ebsBlockDevices",
            ],
        ),
    ],
)
def test_unencrypted_volumes_are_reported(resource_type, props, messages):
    assert rules.check_volume_encryption(resource_type, unknown_checking_proxy(props)) == messages


@pytest.mark.parametrize(
    ("resource_type", "props"),
    [
        (
            rules.SECURITY_GROUP,
            {
                "ingress": [
                    {
                        "protocol": "tcp",
                        "fromPort": 22,
                        "toPort": 22,
                        "cidrBlocks": ["203.0.113.7/32"],
                    },
                    {
                        "protocol": "tcp",
                        "fromPort": 443,
                        "toPort": 443,
                        "cidrBlocks": ["0.0.0.0/0"],
                    },
                    {"protocol": "-1", "fromPort": 0, "toPort": 0, "self": True},
                ]
            },
        ),
        (
            rules.SECURITY_GROUP_RULE,  # egress anywhere is fine
            {
                "type": "egress",
                "protocol": "-1",
                "fromPort": 0,
                "toPort": 0,
                "cidrBlocks": ["0.0.0.0/0"],
            },
        ),
        (
            rules.INGRESS_RULE,
            {"ipProtocol": "tcp", "fromPort": 22, "toPort": 22, "cidrIpv4": "10.0.0.0/16"},
        ),
        (
            rules.INGRESS_RULE,
            {"ipProtocol": "udp", "fromPort": 0, "toPort": 65535, "cidrIpv4": "0.0.0.0/0"},
        ),
    ],
)
def test_ssh_from_a_narrow_range_or_other_ports_pass(resource_type, props):
    assert rules.check_no_public_ssh(resource_type, props) == []


@pytest.mark.parametrize(
    ("resource_type", "props", "message"),
    [
        (
            rules.SECURITY_GROUP,
            {
                "ingress": [
                    {"protocol": "tcp", "fromPort": 22, "toPort": 22, "cidrBlocks": ["0.0.0.0/0"]}
                ]
            },
            "security group allows SSH (port 22) from 0.0.0.0/0: connect with SSM Session Manager",
        ),
        (
            rules.SECURITY_GROUP,
            {
                "ingress": [
                    {"protocol": "-1", "fromPort": 0, "toPort": 0, "ipv6CidrBlocks": ["::/0"]}
                ]
            },
            "security group allows SSH (port 22) from ::/0",
        ),
        (
            rules.SECURITY_GROUP_RULE,
            {
                "type": "ingress",
                "protocol": "6",
                "fromPort": 20,
                "toPort": 30,
                "cidrBlocks": ["0.0.0.0/0"],
            },
            "security group rule allows SSH (port 22) from 0.0.0.0/0",
        ),
        (
            rules.INGRESS_RULE,
            {"ipProtocol": "tcp", "fromPort": 22, "toPort": 22, "cidrIpv4": "0.0.0.0/0"},
            "ingress rule allows SSH (port 22) from 0.0.0.0/0",
        ),
        (
            rules.INGRESS_RULE,
            {"ipProtocol": "-1", "cidrIpv6": "::/0"},
            "ingress rule allows SSH (port 22) from ::/0",
        ),
    ],
)
def test_public_ssh_is_reported(resource_type, props, message):
    (violation,) = rules.check_no_public_ssh(resource_type, unknown_checking_proxy(props))
    assert violation.startswith(message)


def test_gpu_types_outside_the_list_are_reported_and_other_families_pass():
    allowed = ("p4d.24xlarge", "p3.2xlarge")
    check = rules.check_gpu_instance_type
    assert check(rules.INSTANCE, {"instanceType": "p4d.24xlarge"}, allowed) == []
    assert check(rules.INSTANCE, {"instanceType": "t3.micro"}, allowed) == []  # not a GPU
    assert check(rules.LAUNCH_TEMPLATE, {"instanceType": "p5.48xlarge"}, allowed) == [
        "GPU instance type p5.48xlarge is not allowed: use one of p4d.24xlarge, p3.2xlarge, "
        "or add it to the policy's allowedInstanceTypes"
    ]
    (violation,) = check(rules.INSTANCE, {"instanceType": "g5.48xlarge"}, allowed)
    assert violation.startswith("GPU instance type g5.48xlarge is not allowed")


def gpu_node(name="node-0", instance_type="p4d.24xlarge"):
    return StackResource(rules.INSTANCE, name, {"instanceType": instance_type}, urn=f"urn:{name}")


def budget(notifications):
    return StackResource(rules.BUDGET, "budget", {"notifications": notifications}, urn="urn:b")


def test_gpu_stack_without_budget_is_reported():
    (violation,) = rules.check_budget_for_gpus([gpu_node(), gpu_node("node-1")])
    assert violation.message == (
        "the stack launches GPU instances [node-0 (p4d.24xlarge), node-1 (p4d.24xlarge)] without "
        "an AWS Budget: add a budget with notifications (the Guardrails component does) so "
        "spending is seen and stopped"
    )
    assert violation.urn is None  # the whole stack is at fault


def test_budget_without_notifications_does_not_count():
    (violation,) = rules.check_budget_for_gpus([gpu_node(), budget([])])
    assert "without a notification" in violation.message


def test_budget_with_notifications_or_no_gpu_passes():
    notified = budget([{"notificationType": "ACTUAL", "threshold": 80}])
    assert rules.check_budget_for_gpus([gpu_node(), notified]) == []
    assert rules.check_budget_for_gpus([gpu_node("bastion", "t3.micro")]) == []
    template = StackResource(rules.LAUNCH_TEMPLATE, "lt", {"instanceType": "g6e.12xlarge"})
    assert len(rules.check_budget_for_gpus([template])) == 1


def bucket(name="checkpoints"):
    return StackResource(rules.BUCKETS[0], name, {"bucket": f"{name}-1a2b"}, urn=f"urn:{name}")


def test_bucket_without_encryption_is_reported():
    (violation,) = rules.check_bucket_encryption([bucket()])
    assert violation.message.startswith(
        "S3 bucket checkpoints has no server-side encryption configuration: add an "
        "aws.s3.BucketServerSideEncryptionConfiguration for it"
    )
    assert violation.urn == "urn:checkpoints"


def test_bucket_encrypted_by_its_configuration_resource():
    by_name = StackResource(rules.BUCKET_ENCRYPTION[0], "sse", {"bucket": "checkpoints-1a2b"})
    assert rules.check_bucket_encryption([bucket(), by_name]) == []
    # During preview the bucket name is unknown, but the engine knows where it came from.
    preview = StackResource(
        rules.BUCKET_ENCRYPTION[0],
        "sse",
        unknown_checking_proxy({"bucket": UNKNOWN_STRING_VALUE}),
        property_dependencies={"bucket": ("urn:checkpoints",)},
    )
    assert rules.check_bucket_encryption([bucket(), preview]) == []
    # A configuration for another bucket does not cover this one.
    other = StackResource(rules.BUCKET_ENCRYPTION[0], "sse", {"bucket": "logs-9z"})
    assert len(rules.check_bucket_encryption([bucket(), other])) == 1


def test_bucket_with_inline_encryption_passes():
    inline = StackResource(
        rules.BUCKETS[1],
        "legacy",
        {"serverSideEncryptionConfiguration": {"rule": {"bucketKeyEnabled": True}}},
    )
    assert rules.check_bucket_encryption([inline]) == []
