"""The job's own code (training/code.py): shipped by `run --code DIR`, fetched from the job
spool in S3 (moto's server here), on the import path before the builders import."""

from __future__ import annotations

import os
import shutil

import boto3
import pytest

from infra.commands.run import code_archive
from infra.jobs.spool import CODE_NAME, job_key
from tests.support.aws import reset
from tests.training.jobs import job_env, read_metrics, start_job
from tests.training.multirank import REPO_ROOT
from training import code
from training.contract import CODE_URI_ENV
from training.environment import TrainerEnv
from training.spec.config import ConfigError

BUCKET = "stack-checkpoints"
CODE_KEY = job_key("own-model", CODE_NAME)
# examples/custom_model's LSTM and data, under a package name found nowhere else.
CONFIG = """[model]
builder = "lab_models.model:build"
options = { hidden_size = 32, num_layers = 1 }

[data]
builder = "lab_models.data:build"
options = { motif_len = 4, num_samples = 1024 }
vocab_size = 32
seq_len = 32

[train]
steps = 20
micro_batch_size = 16

[optimizer]
lr = 1e-2
weight_decay = 0.0

[scheduler]
kind = "constant"
warmup_steps = 2

[logging]
every_steps = 5
progress_bar = false
"""


@pytest.fixture
def s3(monkeypatch, moto_endpoint):
    reset(moto_endpoint)
    aws = {
        "AWS_ENDPOINT_URL": moto_endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    for key, value in aws.items():
        monkeypatch.setenv(key, value)
    client = boto3.client("s3", region_name="us-east-1")
    client.create_bucket(Bucket=BUCKET)
    return client, aws


def lab_folder(tmp_path, requirements: str | None = None):
    folder = tmp_path / "lab"
    package = folder / "lab_models"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    for module in ("model.py", "data.py"):
        shutil.copy(REPO_ROOT / "examples" / "custom_model" / module, package / module)
    if requirements is not None:
        (folder / "requirements.txt").write_text(requirements)
    return folder


@pytest.mark.multiprocess
@pytest.mark.slow(reason="a real job whose model comes from a shipped --code folder", seconds=90)
def test_a_model_defined_only_in_the_shipped_folder_trains(tmp_path, s3):
    client, aws = s3
    client.put_object(Bucket=BUCKET, Key=CODE_KEY, Body=code_archive(lab_folder(tmp_path)))
    config = tmp_path / "job.toml"
    config.write_text(CONFIG)
    output = tmp_path / "run"
    env = job_env(output, **aws, TRAIN_CODE_URI=f"s3://{BUCKET}/{CODE_KEY}")
    env["TRAIN_CHECKPOINT_DIR"] = str(tmp_path / "checkpoints")
    # Started away from the repository and its examples: only the shipped folder has it.
    (tmp_path / "run-from").mkdir()
    job = start_job(output, config=config, cwd=tmp_path / "run-from", env=env)
    _, stderr = job.communicate(timeout=400)
    assert job.returncode == 0, stderr[-3000:]
    losses = [record["loss"] for record in read_metrics(output)]
    assert len(losses) == 4 and losses[-1] < losses[0]


def test_without_the_folder_the_same_job_cannot_import_its_model(tmp_path, monkeypatch):
    monkeypatch.delenv(CODE_URI_ENV, raising=False)
    assert code.use_job_code(TrainerEnv.from_environ({})) is None
    with pytest.raises(ModuleNotFoundError):
        __import__("lab_models")


def test_the_archive_is_unpacked_and_put_first_on_both_paths(tmp_path, s3, monkeypatch):
    client, _ = s3
    client.put_object(Bucket=BUCKET, Key=CODE_KEY, Body=code_archive(lab_folder(tmp_path)))
    monkeypatch.setattr(code.sys, "path", list(code.sys.path))
    monkeypatch.setattr(code.tempfile, "tempdir", str(tmp_path / "tmp"))
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    environ = {CODE_URI_ENV: f"s3://{BUCKET}/{CODE_KEY}", "PYTHONPATH": "/elsewhere"}
    folder = code.use_job_code(TrainerEnv.from_environ(environ))
    assert (folder / "lab_models" / "model.py").read_text() == (
        REPO_ROOT / "examples" / "custom_model" / "model.py"
    ).read_text()
    assert folder.is_relative_to(tmp_path / "tmp")
    assert code.sys.path[0] == str(folder)
    assert os.environ["PYTHONPATH"] == f"{folder}:/elsewhere"


def test_a_requirement_the_image_meets_installs_nothing(tmp_path, monkeypatch):
    torch_version = __import__("importlib.metadata").metadata.version("torch")
    folder = lab_folder(tmp_path, requirements=f"torch=={torch_version}  # the image's\n\n")
    monkeypatch.setattr(code.sys, "path", list(code.sys.path))
    installs = []
    monkeypatch.setattr(code.subprocess, "run", lambda *a, **k: installs.append(a))
    assert code.use_job_code(TrainerEnv.from_environ({CODE_URI_ENV: str(folder)})) == folder
    assert installs == []


def test_a_requirement_that_conflicts_with_the_image_is_refused_in_one_line(tmp_path):
    folder = lab_folder(tmp_path, requirements="numpy==1.0.0\n")
    with pytest.raises(ConfigError) as refused:
        code.use_job_code(TrainerEnv.from_environ({CODE_URI_ENV: str(folder)}))
    message = str(refused.value)
    installed = __import__("importlib.metadata").metadata.version("numpy")
    assert message == (
        f"requirements.txt line 1: 'numpy==1.0.0' conflicts with the image's numpy "
        f"{installed}: drop the line (the image's version is used) or build an image with it"
    )


def test_a_requirement_the_image_lacks_is_installed_beside_the_code(tmp_path, monkeypatch):
    folder = lab_folder(tmp_path, requirements="surely-not-installed-pkg==1.2\n")
    monkeypatch.setattr(code.sys, "path", list(code.sys.path))
    installs = []
    monkeypatch.setattr(code.subprocess, "run", lambda argv, **k: installs.append(argv))
    monkeypatch.delenv("PYTHONPATH", raising=False)
    code.use_job_code(TrainerEnv.from_environ({CODE_URI_ENV: str(folder)}))
    (argv,) = installs
    assert argv[1:] == [
        "-m", "pip", "install", "--quiet", "--target", str(folder / "_requirements"),
        "surely-not-installed-pkg==1.2",
    ]  # fmt: skip
    assert os.environ["PYTHONPATH"] == f"{folder}:{folder / '_requirements'}"


@pytest.mark.multiprocess
def test_code_the_spool_lost_ends_the_launcher_with_one_line_saying_why(tmp_path, s3):
    """The launcher's own failure (here: the job's code archive is not in S3) ends with the
    line whoever started the job reads the reason from (the node's watcher keeps it)."""
    _, aws = s3
    config = tmp_path / "job.toml"
    config.write_text(CONFIG)
    env = job_env(tmp_path / "run", **aws, TRAIN_CODE_URI=f"s3://{BUCKET}/{CODE_KEY}")
    job = start_job(tmp_path / "run", config=config, env=env)
    _, stderr = job.communicate(timeout=120)
    assert job.returncode == 1, stderr[-3000:]
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("failed: launcher: NoSuchKey: "), last
