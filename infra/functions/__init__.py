"""Code that runs in AWS Lambda, deployed by the Pulumi program as a plain asset archive.

Every module here imports only the standard library and boto3/botocore (which Lambda's Python
runtime provides), so the archive needs no build step: tests/infra/functions/test_imports.py
checks it.
"""
