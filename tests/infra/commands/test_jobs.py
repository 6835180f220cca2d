"""run, jobs and cancel on a single-node stack, against moto's S3: the job spool as the node
sees it, the trainer's checks refusing a bad job before anything is uploaded."""

from __future__ import annotations

import argparse
import io
import json
import tarfile
import time
from pathlib import Path

import pytest

from infra.commands import cancel, jobs
from infra.commands import run as run_job
from infra.errors import ConfigError
from infra.functions.ledger import PERIOD_KEY, Ledger, write_ledger
from infra.jobs.spool import JobSpec, current_run_uri
from infra.targets.ec2_spool import CANCEL_WAIT_S
from tests.infra.commands.conftest import BUCKET, stack_outputs

# Pulumi.a100x8.yaml: one p4d.24xlarge, 8 GPUs of compute capability 8.0.
STACK = "a100x8"
GOOD_JOB = """[train]
steps = 200
global_batch_size = 16
micro_batch_size = 1
"""
# 12 sequences cannot be split over 8 GPUs: the trainer refuses it at start.
BAD_JOB = GOOD_JOB.replace("global_batch_size = 16", "global_batch_size = 12")


@pytest.fixture
def stack(aws, stub_stack):
    stub_stack.outputs_ = stack_outputs(["i-0"], spot=False)
    s3 = aws.client("s3")
    s3.create_bucket(Bucket=BUCKET)
    return s3


def run_args(config: Path, **values) -> argparse.Namespace:
    return argparse.Namespace(
        stack=STACK,
        config=config,
        code=values.get("code"),
        name=values.get("name"),
        overrides=values.get("overrides", []),
    )


def spool_keys(s3) -> list[str]:
    return sorted(o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET).get("Contents", []))


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_run_puts_the_job_and_its_code_in_the_spool(stack, tmp_path):
    config = write(tmp_path, "lr-sweep.toml", GOOD_JOB)
    code = tmp_path / "mycode"
    (code / "mymodels" / "__pycache__").mkdir(parents=True)
    (code / "mymodels" / "__init__.py").write_text("")
    (code / "mymodels" / "tiny.py").write_text("def build(config): ...\n")
    (code / "mymodels" / "__pycache__" / "tiny.cpython-312.pyc").write_bytes(b"\0")
    said = run_job.run(run_args(config, code=code, overrides=["optimizer.lr=1e-4"]))
    assert "job lr-sweep queued on a100x8" in said
    assert spool_keys(stack) == ["jobs/lr-sweep/code.tar.gz", "jobs/lr-sweep/job.json"]
    spec = json.loads(stack.get_object(Bucket=BUCKET, Key="jobs/lr-sweep/job.json")["Body"].read())
    assert spec["name"] == "lr-sweep" and spec["config_toml"] == GOOD_JOB
    assert spec["overrides"] == ["optimizer.lr=1e-4"] and spec["has_code"] is True
    assert spec["usd_per_hour"] == 3.06  # stack_outputs' hourly_cost_usd, on demand
    body = stack.get_object(Bucket=BUCKET, Key="jobs/lr-sweep/code.tar.gz")["Body"].read()
    with tarfile.open(fileobj=io.BytesIO(body)) as archive:
        assert sorted(archive.getnames()) == ["mymodels/__init__.py", "mymodels/tiny.py"]


def test_a_job_the_trainer_would_refuse_never_reaches_the_spool(stack, tmp_path):
    with pytest.raises(ConfigError) as refused:
        run_job.run(run_args(write(tmp_path, "bad.toml", BAD_JOB)))
    message = str(refused.value)
    assert "world size 8" in message and "12" in message and "\n" not in message
    assert spool_keys(stack) == []


def test_a_stack_without_a_stack_file_is_one_line(stack, tmp_path):
    args = run_args(write(tmp_path, "good.toml", GOOD_JOB))
    args.stack = "nosuch"
    with pytest.raises(ConfigError, match=r"^no stack file Pulumi\.nosuch\.yaml next to Pulumi"):
        run_job.run(args)
    assert spool_keys(stack) == []


def test_a_set_the_trainer_would_refuse_is_checked_with_the_config(stack, tmp_path):
    # 12 is not divisible by the stack's 8 GPUs: refused although the file itself is good.
    job = write(tmp_path, "good.toml", GOOD_JOB)
    with pytest.raises(ConfigError) as refused:
        run_job.run(run_args(job, overrides=["train.global_batch_size=12"]))
    assert "world size 8" in str(refused.value) and "12" in str(refused.value)
    # Named as typed: the file and the --set, not the stack key it is checked through.
    assert str(refused.value).startswith(f"--config {job} --set train.global_batch_size=12: ")
    with pytest.raises(ConfigError) as refused:
        run_job.run(run_args(job, overrides=["train.stepz=3"]))
    assert "gpu:trainConfig" not in str(refused.value)
    assert "--set train.stepz=3" in str(refused.value) and "train.stepz: unknown key" in str(
        refused.value
    )
    assert spool_keys(stack) == []


@pytest.mark.parametrize("name", ["../x", "a b", "-lead", "x" * 64])
def test_a_job_name_that_is_no_prefix_is_refused(stack, tmp_path, name):
    with pytest.raises(ConfigError, match="a job name is 1 to 63 letters"):
        run_job.run(run_args(write(tmp_path, "j.toml", GOOD_JOB), name=name))


def test_a_running_job_name_is_refused_and_a_cancelled_one_resumes(stack, tmp_path):
    config = write(tmp_path, "j.toml", GOOD_JOB)
    run_job.run(run_args(config, name="sweep"))
    stack.put_object(Bucket=BUCKET, Key="jobs/sweep/state", Body=b"running")
    with pytest.raises(ConfigError, match="that job is running on a100x8; cancel it first"):
        run_job.run(run_args(config, name="sweep"))
    stack.put_object(Bucket=BUCKET, Key="jobs/sweep/state", Body=b"cancelled")
    stack.put_object(Bucket=BUCKET, Key="jobs/sweep/cancel", Body=b"")
    said = run_job.run(run_args(config, name="sweep"))
    assert "job sweep was cancelled: it resumes from its last checkpoint" in said
    # Queued again: the node's old word and the old cancel request are gone.
    assert spool_keys(stack) == ["jobs/sweep/job.json"]


def test_jobs_lists_each_job_with_the_trainers_progress(stack, tmp_path):
    run_job.run(run_args(write(tmp_path, "first.toml", GOOD_JOB)))
    run_job.run(run_args(write(tmp_path, "second.toml", GOOD_JOB)))
    stack.put_object(Bucket=BUCKET, Key="jobs/first/state", Body=b"yielded")
    stack.put_object(Bucket=BUCKET, Key="jobs/second/state", Body=b"running")
    status = {
        "state": "training", "step": 120, "total_steps": 200, "loss": 2.71828,
        "tokens_per_s": 51234.4, "unit": "tokens", "gpu_hours": 1.25, "usd": 3.825,
    }  # fmt: skip
    stack.put_object(
        Bucket=BUCKET, Key="checkpoints/second/status.json", Body=json.dumps(status).encode()
    )
    lines = jobs.run(argparse.Namespace(stack=STACK)).splitlines()
    assert lines[0].split() == [
        "JOB", "STATE", "STEP", "LOSS", "RATE", "SINCE", "GPU-HOURS", "COST",
    ]  # fmt: skip
    first, second = (line.split() for line in lines[1:])
    assert first[:5] == ["first", "yielded", "-", "-", "-"]
    assert second[:6] == ["second", "running", "120/200", "2.7183", "51,234", "tokens/s"]
    assert second[-2:] == ["1.25", "$3.83"]


def test_on_a_stack_with_a_ledger_a_jobs_cost_is_the_spend_over_its_starts(
    aws, stub_stack, tmp_path
):
    """One job holds the node at a time: its cost is what the ledger counted while it ran."""
    stub_stack.outputs_ = stack_outputs(["i-0"], spot=False, spend_ledger_table="ledger")
    s3, dynamodb = aws.client("s3"), aws.client("dynamodb")
    s3.create_bucket(Bucket=BUCKET)
    dynamodb.create_table(
        TableName="ledger",
        KeySchema=[{"AttributeName": PERIOD_KEY, "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": PERIOD_KEY, "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    # December: $30.00 by 06:00, marked $10.00 at 02:00 and $12.00 at 04:00.
    ledger = Ledger(
        "2026-12", 30.0, 500.0, False, (), "2026-12-01T06:00:00+00:00",
        "2026-12-01T06:00:00+00:00", 5,
        marks=(("2026-12-01T02:00:00+00:00", 10.0), ("2026-12-01T04:00:00+00:00", 12.0)),
    )  # fmt: skip
    write_ledger(dynamodb, "ledger", ledger, after=0)
    run_job.run(run_args(write(tmp_path, "first.toml", GOOD_JOB)))
    s3.put_object(Bucket=BUCKET, Key="jobs/first/state", Body=b"yielded")
    status = {
        "state": "interrupted", "step": 50, "total_steps": 200, "loss": 3.0,
        "tokens_per_s": 1000.0, "unit": "tokens", "gpu_hours": 16.0, "usd": 99.0,
        # 00:00-02:00 ($10.00) and 04:00-06:00 ($30.00 - $12.00): not 02:00-04:00.
        "run_spans": [["2026-12-01T00:00:00+00:00", "2026-12-01T02:00:00+00:00"],
                      ["2026-12-01T04:00:00+00:00", "2026-12-01T06:00:00+00:00"]],
    }  # fmt: skip
    s3.put_object(
        Bucket=BUCKET, Key="checkpoints/first/status.json", Body=json.dumps(status).encode()
    )
    row = jobs.run(argparse.Namespace(stack=STACK)).splitlines()[1].split()
    assert row[0] == "first" and row[-1] == "$28.00"  # not the trainer's $99.00


def test_jobs_on_an_empty_spool_says_how_to_start_one(stack):
    said = jobs.run(argparse.Namespace(stack=STACK))
    assert said == "no job on a100x8: start one with `python -m infra run a100x8 --config JOB.toml`"


def test_cancel_asks_the_node_and_waits_for_its_checkpoint(stack, tmp_path):
    run_job.run(run_args(write(tmp_path, "long.toml", GOOD_JOB)))
    stack.put_object(Bucket=BUCKET, Key="jobs/long/state", Body=b"running")
    polls = []

    def node_stops_the_job(seconds):
        """The node's watcher: it saw the cancel request; the trainer checkpointed."""
        polls.append(seconds)
        assert stack.get_object(Bucket=BUCKET, Key="jobs/long/cancel")
        status = {
            "state": "interrupted", "step": 140, "total_steps": 200, "loss": 3.5,
            "tokens_per_s": 100.0, "updated_at": "2099-01-01T00:00:00+00:00",
        }  # fmt: skip
        stack.put_object(
            Bucket=BUCKET, Key="checkpoints/long/status.json", Body=json.dumps(status).encode()
        )
        stack.put_object(Bucket=BUCKET, Key="checkpoints/long/latest_committed", Body=b"step140")
        stack.put_object(Bucket=BUCKET, Key="jobs/long/state", Body=b"cancelled")

    said = cancel.run(argparse.Namespace(stack=STACK, job="long"), sleep=node_stops_the_job)
    assert polls == [5.0]
    assert said.startswith("job long cancelled: the job stopped at step 140 (interrupted); step140")
    assert jobs.run(argparse.Namespace(stack=STACK)).splitlines()[1].split()[:3] == [
        "long", "cancelled", "140/200",
    ]  # fmt: skip


def test_cancel_of_an_unknown_or_ended_job(stack, tmp_path):
    with pytest.raises(ConfigError, match="no job 'nope' on a100x8"):
        cancel.run(argparse.Namespace(stack=STACK, job="nope"))
    run_job.run(run_args(write(tmp_path, "over.toml", GOOD_JOB)))
    stack.put_object(Bucket=BUCKET, Key="jobs/over/state", Body=b"done")
    assert cancel.run(argparse.Namespace(stack=STACK, job="over")) == (
        "job over is already done: nothing to cancel"
    )


def test_the_spec_refuses_unknown_fields():
    with pytest.raises(ValueError, match="extra"):
        JobSpec.model_validate_json(
            '{"name": "a", "config_toml": "", "usd_per_hour": 1, "submitted_at": '
            '"2026-01-01T00:00:00Z", "gpus": 8}'
        )


def test_a_job_json_newer_than_the_nodes_word_is_queued_again(stack, tmp_path):
    """`up` with a changed gpu:trainConfig rewrites the default job's job.json in place."""
    run_job.run(run_args(write(tmp_path, "default.toml", GOOD_JOB)))
    stack.put_object(Bucket=BUCKET, Key="jobs/default/state", Body=b"done")
    assert jobs.run(argparse.Namespace(stack=STACK)).splitlines()[1].split()[1] == "done"
    time.sleep(1.1)  # S3 keeps LastModified to the second
    spec = stack.get_object(Bucket=BUCKET, Key="jobs/default/job.json")["Body"].read()
    stack.put_object(Bucket=BUCKET, Key="jobs/default/job.json", Body=spec)
    assert jobs.run(argparse.Namespace(stack=STACK)).splitlines()[1].split()[1] == "queued"


def test_status_stop_and_start_follow_the_spools_current_job(stack, tmp_path):
    root = f"s3://{BUCKET}/checkpoints"
    assert current_run_uri(stack, root) == root  # no spool: a stack from before it
    run_job.run(run_args(write(tmp_path, "older.toml", GOOD_JOB)))
    run_job.run(run_args(write(tmp_path, "newer.toml", GOOD_JOB)))
    stack.put_object(Bucket=BUCKET, Key="jobs/newer/state", Body=b"done")
    stack.put_object(Bucket=BUCKET, Key="jobs/older/state", Body=b"running")
    assert current_run_uri(stack, root) == f"{root}/older"
    stack.put_object(Bucket=BUCKET, Key="jobs/older/state", Body=b"yielded")
    time.sleep(1.1)  # S3 keeps LastModified to the second
    stack.put_object(Bucket=BUCKET, Key="jobs/newer/state", Body=b"done")
    assert current_run_uri(stack, root) == f"{root}/newer"  # the last to change


def test_jobs_lists_the_jobs_and_reports_each_spool_object_that_is_not_one(stack, tmp_path):
    run_job.run(run_args(write(tmp_path, "good.toml", GOOD_JOB)))
    good = stack.get_object(Bucket=BUCKET, Key="jobs/good/job.json")["Body"].read()
    objects = {
        "jobs/not-json/job.json": b"{this is not json",
        "jobs/no-keys/job.json": b'{"name": "no-keys"}',
        "jobs/README": b"a stray object beside the jobs",
        "jobs/deep/er/job.json": good,
        "jobs/paused/job.json": good.replace(b'"good"', b'"paused"'),
        "jobs/paused/state": b"paused\n",
        "jobs/garbled/job.json": good.replace(b'"good"', b'"garbled"'),
        "jobs/garbled/state": b"\xff\xfe\x00",
    }
    for key, body in objects.items():
        stack.put_object(Bucket=BUCKET, Key=key, Body=body)
    lines = jobs.run(argparse.Namespace(stack=STACK)).splitlines()
    assert [line.split()[:2] for line in lines[1:2]] == [["good", "queued"]]
    skipped = sorted(line for line in lines[2:] if line)
    assert [line.split(":")[0] for line in skipped] == [
        "skipped jobs/README",
        "skipped jobs/deep/er/job.json",
        "skipped jobs/garbled/state",
        "skipped jobs/no-keys/job.json",
        "skipped jobs/not-json/job.json",
        "skipped jobs/paused/state",
    ]
    assert "not a job" in skipped[4] and "unknown state 'paused'" in skipped[5]
    # run and cancel read the same spool: neither trips over the objects either.
    # No node answers here: a clock past the cancel's wait after one look at the spool.
    clock = iter(range(0, 10**6, CANCEL_WAIT_S))
    said = cancel.run(
        argparse.Namespace(stack=STACK, job="good"), now=lambda: next(clock), sleep=lambda s: None
    )
    assert said.startswith("job good: cancel requested")
    assert "jobs/good/cancel" in spool_keys(stack)


def test_a_failed_job_is_listed_with_the_nodes_reason(stack, tmp_path):
    run_job.run(run_args(write(tmp_path, "broken.toml", GOOD_JOB)))
    why = "rank 0 (local rank 0) on node 0 (ip-10-0-1-7) exited with status 1: RuntimeError: boom"
    state = f"failed\n{why} (exit 1, 4 starts within 6 h)\n".encode()
    stack.put_object(Bucket=BUCKET, Key="jobs/broken/state", Body=state)
    lines = jobs.run(argparse.Namespace(stack=STACK)).splitlines()
    assert lines[1].split()[:2] == ["broken", "failed"]
    assert lines[-1] == f"job broken failed: {why} (exit 1, 4 starts within 6 h)"


def test_hf_token_reaches_the_stacks_secret_and_nothing_the_job_writes(
    stack, tmp_path, monkeypatch
):
    """HF_TOKEN from the shell is stored as the stack's secret (updated by a later run, kept
    by a run without it) and appears in no spool object and no line `run` prints."""
    import boto3

    secrets = boto3.client("secretsmanager", region_name="us-east-1")
    name = "gpu-stack/gpu-training-stack-l4x1/hf-token"  # the stack's cost tag value
    config = write(tmp_path, "gated.toml", GOOD_JOB)
    monkeypatch.setenv("HF_TOKEN", "hf_first_secret_value")
    said = run_job.run(run_args(config))
    assert "HF_TOKEN stored for the stack's jobs (Secrets Manager secret " + name in said
    monkeypatch.setenv("HF_TOKEN", "hf_second_secret_value")
    said += run_job.run(run_args(config, name="gated-2"))
    assert secrets.get_secret_value(SecretId=name)["SecretString"] == "hf_second_secret_value"
    monkeypatch.delenv("HF_TOKEN")
    said += run_job.run(run_args(config, name="gated-3"))
    assert secrets.get_secret_value(SecretId=name)["SecretString"] == "hf_second_secret_value"
    objects = b"".join(
        stack.get_object(Bucket=BUCKET, Key=key)["Body"].read() for key in spool_keys(stack)
    )
    assert len(spool_keys(stack)) == 3 and b"secret_value" not in objects
    assert "secret_value" not in said


# Each --code folder the node would refuse or crash on, refused before anything is uploaded:
# (files, the config's [model] builder, words of the one-line error).
BAD_CODE = [
    ({"mymodels/tiny.py": "def build(config:\n"}, None, ["mymodels/tiny.py line 1", "py_compile"]),
    (
        {"mymodels/tiny.py": "def build(config): ...\n", "requirements.txt": "torch==1.13.0\n"},
        None,
        ["requirements.txt line 1: 'torch==1.13.0' conflicts with the cu130 image's torch"],
    ),
    (
        {"mymodels/tiny.py": "def build(config): ...\n"},
        "mymodels.tiny:make",
        ["model.builder = 'mymodels.tiny:make'", "defines no 'make'"],
    ),
    (
        {"mymodels/tiny.py": "def build(config): ...\n"},
        "mymodels.large:build",
        ["no module mymodels.large"],
    ),
]


@pytest.mark.parametrize(("files", "builder", "words"), BAD_CODE)
def test_code_the_node_would_refuse_is_refused_before_upload(
    stack, tmp_path, files, builder, words
):
    code = tmp_path / "mycode"
    for name, text in files.items():
        (code / name).parent.mkdir(parents=True, exist_ok=True)
        (code / name).write_text(text)
    job = GOOD_JOB + (f'[model]\nbuilder = "{builder}"\n' if builder else "")
    with pytest.raises(ConfigError) as refused:
        run_job.run(run_args(write(tmp_path, "j.toml", job), code=code))
    message = str(refused.value)
    assert "\n" not in message and all(word in message for word in words), message
    assert spool_keys(stack) == []


def test_code_with_a_builder_it_defines_and_requirements_the_image_meets_is_sent(stack, tmp_path):
    code = tmp_path / "mycode"
    (code / "mymodels").mkdir(parents=True)
    (code / "mymodels" / "__init__.py").write_text("")
    (code / "mymodels" / "tiny.py").write_text("import torch\n\ndef build(config): ...\n")
    (code / "requirements.txt").write_text(
        "torch>=2\ntabulate==0.9.0\n"
    )  # not in the lock: installed
    job = GOOD_JOB + '[model]\nbuilder = "mymodels.tiny:build"\n'
    run_job.run(run_args(write(tmp_path, "j.toml", job), code=code))
    assert "jobs/j/code.tar.gz" in spool_keys(stack)


def test_run_dash_dash_command_queues_any_command_with_its_code(stack, tmp_path):
    from infra.cli import main

    code = tmp_path / "my-project"
    code.mkdir()
    (code / "train.py").write_text("print('hello')\n")
    argv = ["run", STACK, "--code", str(code), "--", "torchrun", "--nproc-per-node", "8"]
    argv += ["train.py", "--lr", "3e-4"]  # its own options, not run's
    assert main(argv) == 0
    spec = JobSpec.model_validate_json(
        stack.get_object(Bucket=BUCKET, Key="jobs/my-project/job.json")["Body"].read()
    )
    assert spec.command == ("torchrun", "--nproc-per-node", "8", "train.py", "--lr", "3e-4")
    assert spec.has_code and spec.config_toml == "" and spec.overrides == ()
    assert spec.trainer_arguments() == ["exec", "--", *spec.command]


def test_run_wants_a_config_or_a_command_not_both(stack, tmp_path, capsys):
    from infra.cli import main

    config = write(tmp_path, "job.toml", GOOD_JOB)
    assert main(["run", STACK, "--config", str(config), "--", "python", "x.py"]) == 2
    assert capsys.readouterr().err == (
        "error: --config/--set and -- COMMAND: give one (the trainer's job, or your command)\n"
    )
    assert main(["run", STACK]) == 2
    assert "give the job: --config JOB.toml (the trainer) or -- COMMAND" in capsys.readouterr().err
    assert main(["jobs", STACK, "--", "x"]) == 2
    assert spool_keys(stack) == []


def test_a_command_job_reaches_sbatch_as_training_exec_without_a_config():
    from infra.cluster.jobs import SubmitSite, submit_script

    spec = JobSpec(
        name="cmd",
        config_toml="",
        usd_per_hour=3.06,
        submitted_at="2026-01-01T00:00:00Z",
        command=("torchrun", "train.py", "--lr", "3e-4"),
    )
    script = submit_script(SubmitSite(job_script="/j/train.sbatch", jobs_dir="/j"), spec, None)
    assert script.splitlines()[-1].endswith(
        "--export=ALL /j/train.sbatch exec -- torchrun train.py --lr 3e-4"
    )
