"""The stack's default job (gpu:trainConfig) as the first job of its job spool.

`up` writes it as an S3 object, so changing gpu:trainConfig, or the price, updates that
object in place and no instance (infra/jobs/spool.py; the node's watcher queues a job
whose job.json is newer than its state again).
"""

from __future__ import annotations

import datetime

import pulumi
import pulumi_aws as aws

from infra.jobs.spool import DEFAULT_JOB, SPEC_NAME, JobSpec, job_key

# Before any job `run` submits, so the default job is the first in the spool; fixed, so an
# `up` with nothing changed changes nothing.
FIRST = datetime.datetime(2000, 1, 1, tzinfo=datetime.UTC)


def default_job(
    name: str,
    bucket: pulumi.Input[str],
    config_toml: str,
    usd_per_hour: float,
    opts: pulumi.ResourceOptions,
) -> aws.s3.BucketObjectv2:
    spec = JobSpec(
        name=DEFAULT_JOB, config_toml=config_toml, usd_per_hour=usd_per_hour, submitted_at=FIRST
    )
    return aws.s3.BucketObjectv2(
        f"{name}-default-job",
        bucket=bucket,
        key=job_key(DEFAULT_JOB, SPEC_NAME),
        content=spec.model_dump_json(),
        content_type="application/json",
        opts=opts,
    )
