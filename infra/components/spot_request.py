"""A spot node's persistent request, cancelled before the node is destroyed or replaced.

EC2 keeps a persistent spot request open after its instance is terminated and launches a
new instance for it, which no stack tracks; the Pulumi AWS provider does not cancel the
request when it deletes the instance (hashicorp/terraform-provider-aws issue 38142). EC2's
order for ending one is: cancel the request, then terminate the instance (EC2 User Guide,
"Cancel a Spot Instance request",
https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/using-spot-instances-cancel.html).

`SpotRequestCanceller` is a Pulumi dynamic resource (no plugin to install) that depends on
the node, so Pulumi deletes it first: on `pulumi destroy`, and when the node is replaced.
Its delete cancels the request and terminates the instance; the node's own delete then
finds it terminated.
"""

from __future__ import annotations

from typing import Any

import boto3
import pulumi
from botocore.exceptions import ClientError
from pulumi.dynamic import CreateResult, DiffResult, ResourceProvider

# Already gone is what delete wants: these answers are success.
_GONE = ("InvalidSpotInstanceRequestID.NotFound", "InvalidInstanceID.NotFound")


def cancel_and_terminate(
    spot_request_id: str, instance_id: str, *, region: str, profile: str | None = None
) -> None:
    """Cancel the persistent request, then terminate its instance (EC2's documented order)."""
    ec2 = boto3.Session(profile_name=profile, region_name=region).client("ec2")
    try:
        ec2.cancel_spot_instance_requests(SpotInstanceRequestIds=[spot_request_id])
    except ClientError as error:
        if error.response["Error"]["Code"] not in _GONE:
            raise
    try:
        ec2.terminate_instances(InstanceIds=[instance_id])
    except ClientError as error:
        if error.response["Error"]["Code"] not in _GONE:
            raise


class SpotRequestProvider(ResourceProvider):
    """Create records the request; delete cancels it and terminates its instance."""

    def create(self, props: dict[str, Any]) -> CreateResult:
        return CreateResult(id_=props["spot_request_id"], outs=props)

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        keys = ("spot_request_id", "instance_id", "region", "profile")
        changed = [key for key in keys if olds.get(key) != news.get(key)]
        return DiffResult(changes=bool(changed), replaces=changed, delete_before_replace=True)

    def delete(self, _id: str, props: dict[str, Any]) -> None:
        cancel_and_terminate(
            props["spot_request_id"],
            props["instance_id"],
            region=props["region"],
            profile=props.get("profile"),
        )


class SpotRequestCanceller(pulumi.dynamic.Resource):
    """Cancels `spot_request_id` and terminates `instance_id` when deleted."""

    def __init__(
        self,
        name: str,
        *,
        spot_request_id: pulumi.Input[str],
        instance_id: pulumi.Input[str],
        region: pulumi.Input[str],
        profile: str | None,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__(
            SpotRequestProvider(),
            name,
            {
                "spot_request_id": spot_request_id,
                "instance_id": instance_id,
                "region": region,
                "profile": profile,
            },
            opts,
        )
