"""The aws CLI calls a node's boot and job watcher make, answered by moto's server through
boto3 (AWS_ENDPOINT_URL), printed as the CLI prints them; any other call succeeds silently.

    aws s3 ls s3://BUCKET/PREFIX/ --recursive   "YYYY-MM-DD HH:MM:SS  SIZE KEY" per object,
                                                exit 1 with no output when none matches
    aws s3 cp [--only-show-errors] s3://B/K -   the object to stdout
    aws s3 cp [--only-show-errors] - s3://B/K   stdin to the object
    aws secretsmanager get-secret-value --secret-id ID ...   the secret's string, or the
                                                CLI's ResourceNotFoundException and exit 254
    aws ecr get-login-password                  a token

The formats are the CLI's (awscli, customizations/s3/subcommands.py: ListCommand's
_display_page prints the local time to the second, the size right-aligned in 10, the key).
"""

from __future__ import annotations

import sys

import boto3
from botocore.exceptions import ClientError


def _split(uri: str) -> tuple[str, str]:
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    return bucket, key


def main(argv: list[str]) -> int:
    args, region = [], None
    while argv:
        part = argv.pop(0)
        if part == "--region":
            region = argv.pop(0)
        elif part != "--only-show-errors":
            args.append(part)
    command = args[:2]
    if command == ["ecr", "get-login-password"]:
        print("token")
    elif command == ["secretsmanager", "get-secret-value"]:
        secret = args[args.index("--secret-id") + 1]
        try:
            value = boto3.client("secretsmanager", region_name=region).get_secret_value(
                SecretId=secret
            )
        except ClientError:
            print(
                "An error occurred (ResourceNotFoundException) when calling the GetSecretValue "
                "operation: Secrets Manager can't find the specified secret.",
                file=sys.stderr,
            )
            return 254
        print(value["SecretString"])
    elif command == ["s3", "ls"]:
        bucket, prefix = _split(args[2])
        pages = boto3.client("s3", region_name=region).get_paginator("list_objects_v2")
        pages = pages.paginate(Bucket=bucket, Prefix=prefix)
        found = [item for page in pages for item in page.get("Contents", [])]
        if not found:
            return 1
        for item in found:
            when = item["LastModified"].astimezone()
            print(f"{when:%Y-%m-%d %H:%M:%S} {item['Size']:>10} {item['Key']}")
    elif command == ["s3", "cp"]:
        source, target = args[2], args[3]
        s3 = boto3.client("s3", region_name=region)
        if target == "-":
            bucket, key = _split(source)
            sys.stdout.buffer.write(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
        else:
            bucket, key = _split(target)
            s3.put_object(Bucket=bucket, Key=key, Body=sys.stdin.buffer.read())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
