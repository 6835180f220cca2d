"""The node: the root device of its AMI, the size the config asks for."""

from __future__ import annotations

from tests.support.stack_runs import LAUNCH_TEMPLATE, run_stack


def test_root_volume_is_mapped_on_the_amis_root_device():
    # Both profiles boot Amazon Linux (2023 and 2), whose AMIs name the root /dev/xvda.
    for profile in ("a100x8", "v100x1"):
        (root,) = run_stack(profile=profile).one(LAUNCH_TEMPLATE).inputs["blockDeviceMappings"]
        assert root["deviceName"] == "/dev/xvda"


def test_root_volume_size_follows_the_config():
    run = run_stack(rootVolumeGiB=1200)
    (root,) = run.one(LAUNCH_TEMPLATE).inputs["blockDeviceMappings"]
    assert root["ebs"]["volumeSize"] == 1200
