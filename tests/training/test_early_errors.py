"""Bad input fails in one line with exit 2, before any rank starts (`python -m training`
as a user runs it, one process per input, forked from one that has imported it:
tests/support/preloaded.py)."""

from __future__ import annotations

import socket
import subprocess
import sys

import numpy as np
import pytest

from tests.support.preloaded import run_module
from tests.training.jobs import TINY, job_command, job_env

CUSTOM_MODEL = "model.builder=examples.custom_model.model:build"
CUSTOM_DATA = "data.builder=examples.custom_model.data:build"


def run_training(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    """`args` as job_command gives them: `python -m training ...`."""
    interpreter, flag, module, *rest = args
    assert (interpreter, flag, module) == (sys.executable, "-m", "training"), args
    return run_module(module, rest, env=env)


def assert_refused(result: subprocess.CompletedProcess, words: str, output_dir) -> None:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr[-3000:]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ") and words in lines[0], lines[0]
    assert "starting" not in result.stderr  # the launcher never started a worker
    assert not (output_dir / "metrics.jsonl").exists()


def token_file(path, largest: int):
    np.arange(largest + 1, dtype=np.uint16).repeat(3)[::-1].tofile(path)
    return path


@pytest.mark.parametrize(
    ("env", "overrides", "words"),
    [
        ({"TRAIN_MASTER_PORT": "99999"}, (), "TRAIN_MASTER_PORT = '99999' is not a TCP port"),
        ({"TRAIN_MASTER_PORT": "http"}, (), "TRAIN_MASTER_PORT = 'http' is not a TCP port"),
        ({"TRAIN_S3_URI": "my-bucket"}, (), "expected s3://BUCKET/PREFIX"),
        ({"TRAIN_S3_URI": "s3://My_Bucket/runs"}, (), "is not a valid S3 bucket name"),
        ({"TRAIN_NNODES": "two"}, (), "TRAIN_NNODES = 'two' is not an integer"),
        ({"TRAIN_NODE_RANK": "1"}, (), "TRAIN_NODE_RANK = 1 is outside 0..0"),
        ({"TRAIN_NPROC_PER_NODE": "0"}, (), "TRAIN_NPROC_PER_NODE = 0: give the workers"),
        ({"TRAIN_MASTER_ADDR": "10.0.0.1:29500"}, (), "is not a host name or IP address"),
        ({"TRAIN_SPOT_ENDPOINT": "169.254.169.254"}, (), "is not an http(s) URL"),
        ({"TRAIN_CONFIG": "/nonexistent/job.toml"}, (), "does not exist"),
        ({}, (CUSTOM_MODEL, "model.options={hiden_size = 8}"), "unexpected keyword argument"),
        ({}, (CUSTOM_DATA, "data.options={motif = 8}"), "data.options do not fit"),
    ],
)
def test_bad_environment_or_options_fail_in_one_line(tmp_path, env, overrides, words):
    result = run_training(job_command(*TINY, *overrides), job_env(tmp_path, **env))
    assert_refused(result, words, tmp_path)


def test_a_checkpoint_dir_under_a_file_is_refused(tmp_path):
    (tmp_path / "file").write_text("")
    env = job_env(tmp_path, TRAIN_CHECKPOINT_DIR=str(tmp_path / "file" / "checkpoints"))
    result = run_training(job_command(*TINY), env)
    assert_refused(result, "is a file, not a folder", tmp_path)


def test_a_port_in_use_is_refused_in_one_line(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        env = job_env(tmp_path)
        env["TRAIN_MASTER_PORT"] = str(port)
        result = run_training(job_command(*TINY), env)
    assert_refused(result, f"TRAIN_MASTER_PORT = {port} is already in use", tmp_path)


def test_token_ids_beyond_the_vocabulary_are_refused(tmp_path):
    data = token_file(tmp_path / "train.bin", largest=100)
    overrides = (*TINY, "data.kind=tokens", f"data.path={data}")  # TINY: vocab_size = 64
    result = run_training(job_command(*overrides), job_env(tmp_path))
    assert_refused(result, "holds token id 100, not below data.vocab_size = 64", tmp_path)


@pytest.mark.parametrize("target", ["directory", "under a file"])
def test_export_to_an_unusable_path_fails_in_one_line(tmp_path, target):
    (tmp_path / "file").write_text("")
    out = tmp_path if target == "directory" else tmp_path / "file" / "model.pt"
    result = run_training([*job_command(), "export", str(tmp_path), str(out)], job_env(tmp_path))
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert ("is a directory" if target == "directory" else "is a file") in lines[0]


@pytest.mark.parametrize(
    ("contents", "words"),
    [
        (b"\x01\x00\x02", "holds 3 bytes, not a whole number of uint16 tokens (2 bytes each)"),
        (b"", "holds 0 tokens, fewer than one window of data.seq_len + 1 = 33"),
        (None, "train.bin does not exist: point it at a token .bin file or a folder"),
    ],
    ids=["odd-length", "empty", "missing"],
)
def test_a_token_file_no_rank_could_read_is_refused_once(tmp_path, contents, words):
    data = tmp_path / "data"
    data.mkdir()
    if contents is not None:
        (data / "train.bin").write_bytes(contents)
    overrides = (*TINY, "data.kind=tokens", f"data.path={data}")
    result = run_training(job_command(*overrides), job_env(tmp_path / "run"))
    assert_refused(result, words, tmp_path / "run")
    assert "(or TRAIN_DATA_PATH)" in result.stderr


def test_an_image_folder_without_train_is_refused_once(tmp_path):
    overrides = (
        "model.preset=resnet-tiny",
        "data.kind=image_folder",
        f"data.path={tmp_path}",
        "data.num_classes=4",
        "data.image_size=32",
        "train.micro_batch_size=2",
    )
    result = run_training(job_command(*overrides), job_env(tmp_path / "run"))
    assert_refused(result, "(or TRAIN_DATA_PATH) has no train/ folder", tmp_path / "run")


def test_a_checkpoint_dir_nobody_can_create_is_refused_once(tmp_path):
    # /proc takes no new folders, whoever asks (root included).
    env = job_env(tmp_path, TRAIN_CHECKPOINT_DIR="/proc/gpu-training-test/checkpoints")
    result = run_training(job_command(*TINY), env)
    assert_refused(
        result,
        "TRAIN_CHECKPOINT_DIR = '/proc/gpu-training-test/checkpoints': /proc is not writable",
        tmp_path,
    )


def test_a_config_checkpoint_dir_nobody_can_create_is_refused_once(tmp_path):
    overrides = (*TINY, "checkpoint.dir=/proc/gpu-training-test/checkpoints")
    result = run_training(job_command(*overrides), job_env(tmp_path))
    assert_refused(result, "checkpoint.dir (or TRAIN_CHECKPOINT_DIR) = ", tmp_path)


@pytest.mark.parametrize("command", [(), ("estimate",)], ids=["train", "estimate"])
def test_a_folder_given_as_the_config_is_named(tmp_path, command):
    result = run_training(
        [*job_command(), *command, "--config", str(tmp_path)], job_env(tmp_path / "run")
    )
    assert result.returncode == 2
    assert result.stderr == f"error: config file {tmp_path} is a folder: give a TOML file in it\n"


@pytest.mark.multiprocess
@pytest.mark.parametrize(
    ("source", "words"),
    [
        ("raise RuntimeError('no GPU config here')\n", "RuntimeError: no GPU config here"),
        ("def build(config:\n    pass\n", "SyntaxError: "),
        ("from json import no_such_name\n", "ImportError: cannot import name 'no_such_name'"),
    ],
)
def test_job_code_that_fails_to_import_is_refused_in_one_line(tmp_path, source, words):
    """A `run --code` module that raises on import, does not parse, or imports what is not
    there: bad configuration (exit 2, nothing started), which the node's job watcher marks
    failed and moves past; a traceback and exit 1 read as a crash to retry."""
    code = tmp_path / "code" / "lab"
    code.mkdir(parents=True)
    (code / "__init__.py").write_text("")
    (code / "broken.py").write_text(source)
    env = job_env(tmp_path / "run", TRAIN_CODE_URI=str(tmp_path / "code"))
    result = run_training(job_command(*TINY, "model.builder=lab.broken:build"), env)
    assert_refused(
        result, "model.builder = 'lab.broken:build': cannot import lab.broken", tmp_path / "run"
    )
    assert words in result.stderr
