"""What the trainer leaves beside its checkpoints, read back from moto's S3."""

from __future__ import annotations

import datetime
import json

from infra.deployed.checkpoints import STATUS_NAME, job_status, last_checkpoint, stop_report
from tests.infra.commands.conftest import BUCKET, checkpoint_bucket

URI = f"s3://{BUCKET}/checkpoints"
ASKED = datetime.datetime(2026, 12, 1, 8, 0, tzinfo=datetime.UTC)


def _status(s3, state: str, step: int, at: datetime.datetime) -> None:
    body = {"state": state, "step": step, "total_steps": 1000, "loss": 2.0,
            "tokens_per_s": 1.0, "step_time_s": 1.0, "seconds_left": 0,
            "updated_at": at.isoformat()}  # fmt: skip
    s3.put_object(Bucket=BUCKET, Key=f"checkpoints/{STATUS_NAME}", Body=json.dumps(body))


def test_pointer_and_status(aws):
    s3 = aws.client("s3")
    checkpoint_bucket(s3, ["step_00000100", "step_00000200"])
    assert last_checkpoint(s3, URI).tag == "step_00000200"
    assert job_status(s3, URI) is None
    _status(s3, "training", 250, ASKED)
    assert job_status(s3, URI)["step"] == 250


def test_stop_report_names_the_step_when_the_job_answered_the_stop(aws):
    s3 = aws.client("s3")
    checkpoint_bucket(s3, ["step_00000300"])
    _status(s3, "interrupted", 300, ASKED + datetime.timedelta(seconds=40))
    assert stop_report(s3, URI, ASKED).startswith(
        "the job stopped at step 300 (interrupted); step_00000300 ("
    )


def test_stop_report_does_not_take_an_old_status_for_the_answer(aws):
    s3 = aws.client("s3")
    checkpoint_bucket(s3, ["step_00000300"])
    _status(s3, "interrupted", 300, ASKED - datetime.timedelta(hours=3))  # an earlier spot stop
    assert stop_report(s3, URI, ASKED).startswith("the job did not report a stop")


def test_stop_report_without_any_status(aws):
    s3 = aws.client("s3")
    checkpoint_bucket(s3, [])
    assert "published no progress" in stop_report(s3, URI, ASKED)
