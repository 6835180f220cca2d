"""`down [STACK]`: checkpoint and stop the job, cancel the spot requests, destroy the stack.

Pulumi's destroy leaves the checkpoint bucket and the image repository in the account
unless gpu:deleteDataOnDestroy is true (infra/components/storage.py: retain_on_delete);
the command says what remains and deletes it only with `--delete-data`.

AWS facts this relies on: a bucket holding objects, or old versions of them,
cannot be deleted until every version and delete marker is gone (S3 User Guide,
"Deleting objects from a versioning-enabled bucket"; DeleteObjects takes 1,000 keys
a call); a repository holding images is deleted with them only with `force`
(ECR API reference, DeleteRepository).

A Slurm cluster stack's queue is held first (`stop`): running jobs checkpoint to S3
before CloudFormation deletes the cluster and its nodes. Its CloudWatch log group
(`/aws/parallelcluster/<name>-<timestamp>`) stays after the destroy unless
gpu:deleteDataOnDestroy is true (Monitoring.Logs.CloudWatch.DeletionPolicy,
infra/cluster/config.py), and so do the log groups of ParallelCluster's functions for the
cluster and of its custom resource's provider (infra/deployed/leftovers.py); they are
listed with what is kept on purpose, and deleted with `--delete-data`.

After the destroy it proves nothing bills by mistake: everything still carrying the stack's
cost tag is listed with its monthly cost (infra/deployed/leftovers.py), apart from what is
kept on purpose, and the command exits 1 if there is any. A clean destroy exits 0.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any

from infra import targets
from infra.commands.outcome import Outcome
from infra.deployed import leftovers, workspace
from infra.deployed.checkpoints import last_checkpoint
from infra.deployed.stack_image import ImageRef
from infra.jobs import hf_token
from infra.jobs.spool import current_run_uri
from training.contract import HF_TOKEN_ENV

EXIT_LEFTOVERS = 1  # something still carries the stack's cost tag after the destroy


def add_arguments(parser: argparse.ArgumentParser) -> None:
    workspace.add_stack_argument(parser)
    parser.add_argument("--yes", "-y", action="store_true", help="destroy without asking")
    parser.add_argument(
        "--delete-data",
        action="store_true",
        help="also delete the checkpoints in the bucket and the images in the repository",
    )


def repository_name(image_uri: str | None) -> str | None:
    """`<account>.dkr.ecr.<region>.amazonaws.com/<name>:<tag>[@sha256:...]` -> `<name>`."""
    if not image_uri or "/" not in image_uri:
        return None
    return ImageRef.parse(image_uri).repository


def run(
    args: argparse.Namespace,
    *,
    out=None,
    ask: Callable[[str], str] | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> str | Outcome:
    """Checkpoint and stop the job, cancel spot requests, destroy; keep data unless asked;
    then list what still carries the stack's cost tag (exit 1 if anything does)."""
    out = out or sys.stdout
    say = workspace.printer(out)
    name = workspace.stack_name(args)
    machine = targets.without_pulumi(name)
    if machine is not None:
        return _down_machine(machine, args, say=say, ask=ask, sleep=sleep)
    stack = workspace.open_stack(name)
    values = stack.outputs()
    if not values:
        # Its first `up` stopped before the program wrote its outputs: no job runs and no
        # bucket or repository is known to list; destroy what Pulumi made.
        if not workspace.confirm(
            f"Destroy stack {name} (its first `up` did not finish)?",
            yes=args.yes,
            ask=ask,
            what=f"down {name}",
        ):
            return "nothing was destroyed"
        stack.destroy(on_output=say, color="never")
        return f"stack {name} is destroyed"
    outputs = workspace.stack_outputs(name, values)
    region = workspace.stack_region(stack, name)
    deployed = workspace.Deployed(name, region, outputs)
    bucket = outputs.checkpoint_bucket
    repository = repository_name(outputs.image_uri)
    data = " and ".join(
        part
        for part in (bucket and f"bucket {bucket}", repository and f"repository {repository}")
        if part
    )
    fate = "DELETE" if args.delete_data else "keep"
    target = targets.open_target(deployed)
    what = target.describe()
    question = f"Destroy stack {name} ({what}) and {fate} {data or 'no data'}?"
    if not workspace.confirm(question, yes=args.yes, ask=ask, what=f"down {name}"):
        return "nothing was destroyed"

    target.before_destroy(say=say, sleep=sleep)
    s3 = workspace.aws("s3", region) if bucket else None
    ecr = workspace.aws("ecr", region) if repository else None
    checkpoint = last_checkpoint(s3, current_run_uri(s3, outputs.checkpoint_uri)) if s3 else None
    stack.destroy(on_output=say, color="never")
    secret = hf_token.secret_name(deployed.cost_tag[1])
    if hf_token.delete(workspace.aws("secretsmanager", region), secret):
        say(f"deleted the stack's {HF_TOKEN_ENV} secret {secret}")
    deleted = []
    if args.delete_data:
        if bucket and bucket_exists(s3, bucket):
            say(f"deleted {delete_bucket(s3, bucket)} object version(s) and the bucket {bucket}")
        if repository and repository_exists(ecr, repository):
            images = delete_repository(ecr, repository)
            say(f"deleted the repository {repository} and its {images} image(s)")
        groups = target.log_groups()
        cloudwatch_logs = workspace.aws("logs", region) if groups else None
        for group in groups:
            cloudwatch_logs.delete_log_group(logGroupName=group.resource_id)
            say(f"deleted the log group {group.resource_id}")
        deleted = ["its data with it"]
    kept = []
    if bucket and bucket_exists(s3, bucket):
        count, size = bucket_usage(s3, bucket)
        last = f", last checkpoint {checkpoint.describe()}" if checkpoint else ""
        uploads = leftovers.unfinished_uploads(s3, bucket)
        unfinished = f", {uploads} unfinished multipart upload(s)" if uploads else ""
        kept.append(f"  s3://{bucket}: {count} object(s), {size / 2**30:.2f} GiB{last}{unfinished}")
    if repository and repository_exists(ecr, repository):
        kept.append(f"  repository {repository}: {len(_image_ids(ecr, repository))} image(s)")
    # Kept because gpu:deleteDataOnDestroy is false; gone already after --delete-data.
    kept_logs = target.log_groups()
    kept += [log.describe() for log in kept_logs]
    kept += target.kept_after_destroy()
    # The kept log groups carry the stack's tags too: kept on purpose, not left over.
    kept_ids = {log.resource_id for log in kept_logs}
    unexpected = [
        leftover
        for leftover in _unexpected(outputs.cost_tag, region)
        if leftover.resource_id not in kept_ids
    ]
    lines = [f"stack {name} is destroyed" + "".join(f", {d}" for d in deleted)]
    if kept:
        lines += ["kept on purpose (it keeps costing storage):", *kept]
        if not args.delete_data:
            lines.append(f"delete it with `python -m infra down {name} --delete-data`")
    if not unexpected:
        lines[0] += "; nothing else carrying its cost tag remains" if kept else "; nothing remains"
        return "\n".join(lines)
    monthly = sum(leftover.monthly_usd for leftover in unexpected)
    lines += [
        f"still there though the stack is gone (about ${monthly:,.2f} a month):",
        *(leftover.describe() for leftover in unexpected),
        "delete them (EC2 console, or the AWS CLI) or find why the destroy kept them",
    ]
    return Outcome("\n".join(lines), EXIT_LEFTOVERS)


def _down_machine(
    target: targets.MachineTarget, args: argparse.Namespace, *, say, ask, sleep
) -> str:
    """A stack no Pulumi program makes (this machine): its jobs stop with a checkpoint;
    nothing was rented, so nothing is left billing; the data goes only with --delete-data."""
    name = target.stack.name
    fate = "DELETE" if args.delete_data else "keep"
    question = f"Stop every job on stack {name} ({target.describe()}) and {fate} their data?"
    if not workspace.confirm(question, yes=args.yes, ask=ask, what=f"down {name}"):
        return "nothing was stopped"
    target.before_destroy(say=say, sleep=sleep)
    lines = [f"stack {name}: no job runs; nothing was rented, so nothing bills"]
    if args.delete_data:
        return "\n".join([*lines, target.delete_data()])
    kept = target.kept_after_destroy()
    if kept:
        lines += [
            "kept (it takes disk space only):",
            *kept,
            f"delete it with `python -m infra down {name} --delete-data`",
        ]
    return "\n".join(lines)


def _unexpected(cost_tag: str | None, region: str) -> list[leftovers.Leftover]:
    """What still carries the stack's cost tag after the destroy (nothing should)."""
    if not cost_tag:
        return []
    key, _, value = cost_tag.partition("=")
    return leftovers.tagged_leftovers(lambda service: workspace.aws(service, region), (key, value))


def bucket_exists(s3: Any, bucket: str) -> bool:
    try:
        s3.head_bucket(Bucket=bucket)
    except s3.exceptions.ClientError as exc:
        if exc.response["Error"]["Code"] in ("404", "NoSuchBucket"):
            return False
        raise
    return True


def delete_bucket(s3: Any, bucket: str) -> int:
    """Delete every object version and delete marker in `bucket`, then the bucket; how many."""
    deleted = 0
    for page in s3.get_paginator("list_object_versions").paginate(Bucket=bucket):
        keys = [
            {"Key": item["Key"], "VersionId": item["VersionId"]}
            for item in (*page.get("Versions", []), *page.get("DeleteMarkers", []))
        ]
        for batch in workspace.chunks(keys, 1000):
            s3.delete_objects(Bucket=bucket, Delete={"Objects": list(batch), "Quiet": True})
            deleted += len(batch)
    s3.delete_bucket(Bucket=bucket)
    return deleted


def repository_exists(ecr: Any, repository: str) -> bool:
    try:
        ecr.describe_repositories(repositoryNames=[repository])
    except ecr.exceptions.RepositoryNotFoundException:
        return False
    return True


def _image_ids(ecr: Any, repository: str) -> list[dict]:
    pages = ecr.get_paginator("list_images").paginate(repositoryName=repository)
    return [image for page in pages for image in page["imageIds"]]


def delete_repository(ecr: Any, repository: str) -> int:
    """Delete the repository with its images (force); how many images it held."""
    images = len(_image_ids(ecr, repository))
    ecr.delete_repository(repositoryName=repository, force=True)
    return images


def bucket_usage(s3: Any, bucket: str) -> tuple[int, int]:
    count = size = 0
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        for item in page.get("Contents", []):
            count, size = count + 1, size + item["Size"]
    return count, size
