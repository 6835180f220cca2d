"""`down [STACK]`: checkpoint and stop the job, cancel the spot requests, destroy the stack.

The checkpoint bucket and the image repository stay unless `--delete-data`: the
command says what remains. Without it, Pulumi destroys every other resource (a
targeted destroy) and keeps those two in the stack; `--delete-data` empties them and
destroys everything.

AWS facts this relies on: a bucket holding objects, or old versions of them,
cannot be deleted until every version and delete marker is gone (S3 User Guide,
"Deleting objects from a versioning-enabled bucket"; DeleteObjects takes 1,000 keys
a call); a repository holding images cannot be deleted without them
(ECR API reference, DeleteRepository; BatchDeleteImage takes 100 image IDs a call).
"""

from __future__ import annotations

import argparse
import datetime
import sys
import time
from collections.abc import Callable
from typing import Any

from infra.commands import nodes, workspace
from infra.commands.checkpoints import last_checkpoint, stop_report

# Kept by a plain `down`: the checkpoint bucket with its settings, the image repository.
KEPT_TYPE_PREFIXES = ("aws:s3/", "aws:ecr/")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    workspace.add_stack_argument(parser)
    parser.add_argument("--yes", "-y", action="store_true", help="destroy without asking")
    parser.add_argument(
        "--delete-data",
        action="store_true",
        help="also delete the checkpoints in the bucket and the images in the repository",
    )


def repository_name(image_uri: str | None) -> str | None:
    """`<account>.dkr.ecr.<region>.amazonaws.com/<name>:<tag>` -> `<name>`."""
    if not image_uri or "/" not in image_uri:
        return None
    return image_uri.split("/", 1)[1].rsplit(":", 1)[0]


def run(
    args: argparse.Namespace,
    *,
    out=None,
    ask: Callable[[str], str] | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> str:
    """Checkpoint and stop the job, cancel spot requests, destroy; keep data unless asked."""
    out = out or sys.stdout
    say = workspace.printer(out)
    name = workspace.stack_name(args)
    stack = workspace.open_stack(name)
    outputs = {key: output.value for key, output in stack.outputs().items()}
    region = workspace.stack_region(stack, name)
    instance_ids = list(outputs.get("instance_ids") or [])
    bucket = outputs.get("checkpoint_bucket")
    repository = repository_name(outputs.get("image_uri"))
    data = " and ".join(
        part
        for part in (bucket and f"bucket {bucket}", repository and f"repository {repository}")
        if part
    )
    fate = "DELETE" if args.delete_data else "keep"
    question = f"Destroy stack {name} ({len(instance_ids)} node(s)) and {fate} {data or 'no data'}?"
    if not workspace.confirm(question, yes=args.yes, ask=ask, what=f"down {name}"):
        return "nothing was destroyed"

    if instance_ids:
        ec2 = workspace.aws("ec2", region)
        running = [n.instance_id for n in nodes.nodes(ec2, instance_ids) if n.state == "running"]
        if running:
            asked = datetime.datetime.now(datetime.UTC)
            results = nodes.stop_job(workspace.aws("ssm", region), running, say=say, sleep=sleep)
            say(", ".join(f"{i}: {status}" for i, status in sorted(results.items())))
            if outputs.get("checkpoint_uri"):
                say(stop_report(workspace.aws("s3", region), outputs["checkpoint_uri"], asked))
        cancelled = nodes.cancel_spot_requests(ec2, instance_ids)
        if cancelled:
            say(f"cancelled spot request(s) {', '.join(cancelled)} before the destroy")
    s3 = workspace.aws("s3", region) if bucket else None
    checkpoint = last_checkpoint(s3, outputs.get("checkpoint_uri")) if s3 else None
    if args.delete_data:
        if bucket:
            say(f"deleted {empty_bucket(s3, bucket)} object version(s) from {bucket}")
        if repository:
            ecr = workspace.aws("ecr", region)
            say(f"deleted {delete_images(ecr, repository)} image(s) from {repository}")
        stack.destroy(on_output=say, color="never")
        return f"stack {name} is destroyed, its data with it; nothing remains"

    targets = [r["urn"] for r in _resources(stack) if not r["type"].startswith(KEPT_TYPE_PREFIXES)]
    stack.destroy(target=targets, on_output=say, color="never")
    remains = []
    if bucket:
        count, size = bucket_usage(s3, bucket)
        last = f", last checkpoint {checkpoint.describe()}" if checkpoint else ""
        remains.append(f"  s3://{bucket}: {count} object(s), {size / 2**30:.2f} GiB{last}")
    if repository:
        images = len(_image_ids(workspace.aws("ecr", region), repository))
        remains.append(f"  repository {repository}: {images} image(s)")
    return "\n".join(
        [
            f"stack {name}: every node, network and guardrail is destroyed; what remains:",
            *remains,
            f"delete it with `python -m infra down {name} --delete-data`",
        ]
    )


def _resources(stack: Any) -> list[dict]:
    """The stack's AWS resources (not the providers, components or the stack itself)."""
    return [
        resource
        for resource in stack.export_stack().deployment.get("resources", [])
        if resource.get("custom") and not resource["type"].startswith("pulumi:providers:")
    ]


def empty_bucket(s3: Any, bucket: str) -> int:
    """Delete every object version and delete marker in `bucket`; how many."""
    deleted = 0
    for page in s3.get_paginator("list_object_versions").paginate(Bucket=bucket):
        keys = [
            {"Key": item["Key"], "VersionId": item["VersionId"]}
            for item in (*page.get("Versions", []), *page.get("DeleteMarkers", []))
        ]
        for batch in workspace.chunks(keys, 1000):
            s3.delete_objects(Bucket=bucket, Delete={"Objects": list(batch), "Quiet": True})
            deleted += len(batch)
    return deleted


def _image_ids(ecr: Any, repository: str) -> list[dict]:
    pages = ecr.get_paginator("list_images").paginate(repositoryName=repository)
    return [image for page in pages for image in page["imageIds"]]


def delete_images(ecr: Any, repository: str) -> int:
    images = _image_ids(ecr, repository)
    for batch in workspace.chunks(images, 100):
        ecr.batch_delete_image(repositoryName=repository, imageIds=list(batch))
    return len(images)


def bucket_usage(s3: Any, bucket: str) -> tuple[int, int]:
    count = size = 0
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        for item in page.get("Contents", []):
            count, size = count + 1, size + item["Size"]
    return count, size
