"""S3Mirror against moto's real S3 server on loopback."""

from __future__ import annotations

import fnmatch
import json

import boto3
import pytest

from infra.components.iam import instance_policy
from infra.components.storage import CHECKPOINT_PREFIX
from training.checkpoint.layout import COMMIT_MARKER, POINTER_NAME
from training.checkpoint.s3 import S3Mirror


class UploadCut(Exception):
    """Stands for the instance going away in the middle of an upload."""


def committed_folder(root, tag, files):
    folder = root / tag
    (folder / "sub").mkdir(parents=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)
    listing = {name: len(data) for name, data in files.items()}
    (folder / COMMIT_MARKER).write_text(json.dumps({"tag": tag, "files": listing}))
    return folder


def cut_upload_at(mirror, key_suffix):
    """Make every S3 write of a key ending in ``key_suffix`` fail, through boto3's own hooks."""

    def refuse(params, **_):
        if params["Key"].endswith(key_suffix):
            raise UploadCut(params["Key"])

    mirror._s3.meta.events.register("before-parameter-build.s3.PutObject", refuse)
    mirror._s3.meta.events.register("before-parameter-build.s3.CreateMultipartUpload", refuse)


def cut_upload_at_part(mirror):
    """Make a multipart upload fail after its first part."""

    def refuse(params, **_):
        if params["PartNumber"] > 1:
            raise UploadCut(params["Key"])

    mirror._s3.meta.events.register("before-parameter-build.s3.UploadPart", refuse)


FILES = {"model.pt": b"weights" * 100, "sub/optim.pt": b"adam" * 50}


@pytest.mark.parametrize(
    "uri",
    ["bucket/prefix", "s3://", "s3://bucket", "s3://bucket/", "s3:///prefix", "https://b/p"],
)
def test_bad_uri_names_the_variable_and_the_form(uri):
    with pytest.raises(ValueError) as error:
        S3Mirror.from_uri(uri)
    message = str(error.value)
    assert f"TRAIN_S3_URI = {uri!r}" in message and "s3://BUCKET/PREFIX" in message


def test_uri_parts():
    mirror = S3Mirror.from_uri("s3://my-bucket/runs/gpt/")
    assert (mirror.bucket, mirror.prefix) == ("my-bucket", "runs/gpt")
    assert mirror.uri == "s3://my-bucket/runs/gpt"


def test_upload_then_download_round_trip(tmp_path, s3_uri):
    mirror = S3Mirror.from_uri(s3_uri)
    assert mirror.latest_tag() is None
    folder = committed_folder(tmp_path / "a", "step_00000010", FILES)
    mirror.upload(folder, "step_00000010")

    assert mirror.latest_tag() == "step_00000010"
    got = mirror.download("step_00000010", tmp_path / "b")
    assert got == tmp_path / "b" / "step_00000010"
    for name, data in FILES.items():
        assert (got / name).read_bytes() == data
    assert (got / COMMIT_MARKER).read_text() == (folder / COMMIT_MARKER).read_text()
    assert [p.name for p in (tmp_path / "b").iterdir()] == ["step_00000010"]  # no staging left


def test_marker_and_pointer_are_written_last(tmp_path, s3_uri):
    mirror = S3Mirror.from_uri(s3_uri)
    order = []
    mirror._s3.meta.events.register(
        "before-parameter-build.s3.PutObject", lambda params, **_: order.append(params["Key"])
    )
    mirror.upload(committed_folder(tmp_path, "step_00000001", FILES), "step_00000001")
    assert order[-2:] == [
        f"{mirror.prefix}/step_00000001/{COMMIT_MARKER}",
        f"{mirror.prefix}/{POINTER_NAME}",
    ]
    assert len(order) == len(FILES) + 2


def test_upload_cut_before_its_marker_is_not_seen(tmp_path, s3_uri):
    mirror = S3Mirror.from_uri(s3_uri)
    mirror.upload(committed_folder(tmp_path, "step_00000001", FILES), "step_00000001")
    cut_upload_at(mirror, COMMIT_MARKER)
    with pytest.raises(UploadCut):
        mirror.upload(committed_folder(tmp_path, "step_00000002", FILES), "step_00000002")

    assert "step_00000002" in mirror.tags()  # its shards are there...
    assert not mirror.is_committed("step_00000002")  # ...but it never committed
    assert S3Mirror.from_uri(s3_uri).latest_tag() == "step_00000001"
    with pytest.raises(FileNotFoundError, match="step_00000002"):
        S3Mirror.from_uri(s3_uri).download("step_00000002", tmp_path / "out")


def test_upload_cut_before_its_pointer_is_not_seen(tmp_path, s3_uri):
    mirror = S3Mirror.from_uri(s3_uri)
    mirror.upload(committed_folder(tmp_path, "step_00000001", FILES), "step_00000001")
    cut_upload_at(mirror, POINTER_NAME)
    with pytest.raises(UploadCut):
        mirror.upload(committed_folder(tmp_path, "step_00000002", FILES), "step_00000002")
    assert S3Mirror.from_uri(s3_uri).latest_tag() == "step_00000001"


@pytest.mark.parametrize("pointer", [None, b"not a tag", b"step_00000009"])
def test_unusable_pointer_falls_back_to_newest_committed(tmp_path, s3_uri, pointer):
    mirror = S3Mirror.from_uri(s3_uri)
    for step in (1, 2):
        tag = f"step_{step:08d}"
        mirror.upload(committed_folder(tmp_path, tag, FILES), tag)
    # An uncommitted newer tag (shards only) must not be picked either.
    boto3.client("s3").put_object(
        Bucket=mirror.bucket, Key=f"{mirror.prefix}/step_00000003/model.pt", Body=b"x"
    )
    key = f"{mirror.prefix}/{POINTER_NAME}"
    if pointer is None:
        boto3.client("s3").delete_object(Bucket=mirror.bucket, Key=key)
    else:
        boto3.client("s3").put_object(Bucket=mirror.bucket, Key=key, Body=pointer)
    assert mirror.latest_tag() == "step_00000002"


def test_committed_tags_stop_at_the_pointer(tmp_path, s3_uri):
    mirror = S3Mirror.from_uri(s3_uri)
    for step in (1, 2):
        tag = f"step_{step:08d}"
        mirror.upload(committed_folder(tmp_path, tag, FILES), tag)
    # Files and marker of step 3 arrived, its pointer write did not.
    newer = committed_folder(tmp_path, "step_00000003", FILES)
    mirror.upload_files(newer, "step_00000003")
    boto3.client("s3").upload_file(
        str(newer / COMMIT_MARKER), mirror.bucket, f"{mirror.prefix}/step_00000003/{COMMIT_MARKER}"
    )
    assert mirror.is_committed("step_00000003")
    assert mirror.committed_tags() == ["step_00000001", "step_00000002"]


def test_download_completes_a_partial_copy_of_the_same_checkpoint(tmp_path, s3_uri):
    mirror = S3Mirror.from_uri(s3_uri)
    folder = committed_folder(tmp_path / "a", "step_00000005", FILES)
    mirror.upload(folder, "step_00000005")
    (folder / "sub" / "optim.pt").unlink()  # this node never had that part
    kept_inode = (folder / "model.pt").stat().st_ino
    mirror.download("step_00000005", tmp_path / "a")
    assert (folder / "model.pt").stat().st_ino == kept_inode
    assert (folder / "sub" / "optim.pt").read_bytes() == FILES["sub/optim.pt"]


def test_download_replaces_a_stale_local_folder(tmp_path, s3_uri):
    mirror = S3Mirror.from_uri(s3_uri)
    mirror.upload(committed_folder(tmp_path / "a", "step_00000005", FILES), "step_00000005")
    stale = tmp_path / "b" / "step_00000005"
    stale.mkdir(parents=True)
    (stale / "leftover.pt").write_bytes(b"half")
    (stale / "model.pt").write_bytes(b"WEIGHTS" * 100)  # right size, another run's marker
    (stale / COMMIT_MARKER).write_text('{"from": "another run"}')
    got = mirror.download("step_00000005", tmp_path / "b")
    assert (got / "model.pt").read_bytes() == FILES["model.pt"]
    assert sorted(p.relative_to(got).as_posix() for p in got.rglob("*") if p.is_file()) == sorted(
        [*FILES, COMMIT_MARKER]
    )


def test_delete_removes_every_object_of_a_tag_only(tmp_path, s3_uri):
    mirror = S3Mirror.from_uri(s3_uri)
    for tag in ("step_00000001", "step_00000002"):
        mirror.upload(committed_folder(tmp_path, tag, FILES), tag)
    mirror.delete("step_00000001")
    assert mirror.tags() == ["step_00000002"]
    listed = boto3.client("s3").list_objects_v2(Bucket=mirror.bucket)["Contents"]
    assert not [o for o in listed if "/step_00000001/" in o["Key"]]


def test_uncommitted_folder_is_refused(tmp_path, s3_uri):
    folder = tmp_path / "step_00000001"
    folder.mkdir()
    (folder / "model.pt").write_bytes(b"x")
    with pytest.raises(FileNotFoundError, match=COMMIT_MARKER):
        S3Mirror.from_uri(s3_uri).upload(folder, "step_00000001")


def test_other_prefixes_and_names_are_left_alone(tmp_path, s3_uri):
    mirror = S3Mirror.from_uri(s3_uri)
    s3 = boto3.client("s3")
    s3.put_object(Bucket=mirror.bucket, Key=f"{mirror.prefix}-other/step_00000007/x", Body=b"x")
    s3.put_object(Bucket=mirror.bucket, Key=f"{mirror.prefix}/notes/readme.txt", Body=b"x")
    mirror.upload(committed_folder(tmp_path, "step_00000001", FILES), "step_00000001")
    assert mirror.tags() == ["step_00000001"]


# The IAM action (and whether it is on the bucket or on its objects) each S3 API call
# needs: AWS Service Authorization Reference, "Actions, resources, and condition keys
# for Amazon S3", and the S3 User Guide's "Required permissions for Amazon S3 API operations".
S3_CALL_PERMISSIONS = {
    "ListObjectsV2": ("s3:ListBucket", "bucket"),
    "HeadBucket": ("s3:ListBucket", "bucket"),
    "GetBucketLocation": ("s3:GetBucketLocation", "bucket"),
    "HeadObject": ("s3:GetObject", "object"),
    "GetObject": ("s3:GetObject", "object"),
    "PutObject": ("s3:PutObject", "object"),
    "CreateMultipartUpload": ("s3:PutObject", "object"),
    "UploadPart": ("s3:PutObject", "object"),
    "CompleteMultipartUpload": ("s3:PutObject", "object"),
    "AbortMultipartUpload": ("s3:AbortMultipartUpload", "object"),
    "ListParts": ("s3:ListMultipartUploadParts", "object"),
    "DeleteObject": ("s3:DeleteObject", "object"),
    "DeleteObjects": ("s3:DeleteObject", "object"),
}


def granted(policy: dict, action: str, resource: str) -> bool:
    """Whether an Allow statement without conditions grants `action` on `resource`."""
    return any(
        statement["Effect"] == "Allow"
        and "Condition" not in statement
        and _matches(action, statement["Action"])
        and _matches(resource, statement["Resource"])
        for statement in policy["Statement"]
    )


def _matches(value: str, patterns) -> bool:
    patterns = [patterns] if isinstance(patterns, str) else patterns
    return any(fnmatch.fnmatchcase(value, pattern) for pattern in patterns)


def test_the_nodes_role_grants_every_call_the_mirror_makes(tmp_path, s3_uri):
    # The stack's TRAIN_S3_URI: its own bucket, under infra.components.storage's prefix.
    bucket = S3Mirror.from_uri(s3_uri).bucket
    mirror = S3Mirror.from_uri(f"s3://{bucket}/{CHECKPOINT_PREFIX}")
    calls = []

    def record(params, model, **_):
        batch = params.get("Delete", {}).get("Objects", [])
        for key in [params["Key"]] if "Key" in params else [o["Key"] for o in batch] or [None]:
            calls.append((model.name, key))

    mirror._s3.meta.events.register("before-parameter-build.s3", record)

    # A file over boto3's 8 MiB threshold goes up in parts and comes down in ranges.
    large = {"model.pt": bytes(9 * 1024 * 1024), "sub/optim.pt": b"adam" * 50}
    mirror.upload(committed_folder(tmp_path / "local", "step_00000010", large), "step_00000010")
    mirror.upload(committed_folder(tmp_path / "local", "step_00000020", FILES), "step_00000020")
    mirror.download(mirror.latest_tag(), tmp_path / "restored")
    mirror.download("step_00000010", tmp_path / "restored")
    mirror.delete("step_00000010")
    # An upload cut short aborts its multipart upload.
    cut_upload_at_part(mirror)
    with pytest.raises(UploadCut):
        mirror.upload(committed_folder(tmp_path / "local", "step_00000030", large), "step_00000030")

    operations = {name for name, _ in calls}
    assert {"CreateMultipartUpload", "UploadPart", "AbortMultipartUpload"} <= operations
    unknown = operations - S3_CALL_PERMISSIONS.keys()
    assert not unknown, f"add the IAM action of {sorted(unknown)} to S3_CALL_PERMISSIONS"
    bucket_arn = f"arn:aws:s3:::{bucket}"
    policy = instance_policy(bucket_arn, "arn:aws:ecr:::repository/r", "arn:aws:logs:::log-group:g")
    for name, key in calls:
        action, kind = S3_CALL_PERMISSIONS[name]
        resource = bucket_arn if kind == "bucket" else f"{bucket_arn}/{key}"
        assert kind == "bucket" or key.startswith(f"{CHECKPOINT_PREFIX}/"), (name, key)
        assert granted(policy, action, resource), f"{name} needs {action} on {resource}"
