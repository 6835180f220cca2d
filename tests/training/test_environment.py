"""The trainer's environment, read once (TrainerEnv), and the launcher's rendezvous port."""

from __future__ import annotations

import ast
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.training.multirank import REPO_ROOT
from training.contract import DEFAULT_MASTER_PORT
from training.environment import TopologyError, TrainerEnv
from training.launcher import rendezvous_port, topology_from_env


def _topology(environ: dict[str, str]):
    return topology_from_env(TrainerEnv.from_environ(environ))


def test_a_single_node_without_a_port_takes_a_free_one():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        ports = {rendezvous_port(_topology({}), TrainerEnv()).master_port for _ in range(3)}
    assert taken not in ports and DEFAULT_MASTER_PORT not in ports
    for port in ports:
        with socket.socket() as probe:
            probe.bind(("", port))  # it was free


def test_several_nodes_keep_the_configured_port():
    env = {"TRAIN_NNODES": "2", "TRAIN_NODE_RANK": "1", "TRAIN_MASTER_ADDR": "10.0.0.1"}
    parsed = TrainerEnv.from_environ(env)
    assert rendezvous_port(topology_from_env(parsed), parsed).master_port == DEFAULT_MASTER_PORT


@pytest.mark.parametrize(
    "env",
    [
        {"TRAIN_MASTER_PORT": "0"},
        {"TRAIN_MASTER_PORT": "65536"},
        {"TRAIN_MASTER_ADDR": "http://node0"},
        {"TRAIN_MASTER_ADDR": "node 0"},
        {"TRAIN_S3_URI": "s3://ab/prefix"},
        {"TRAIN_SPOT_ENDPOINT": "localhost:1338"},
    ],
)
def test_bad_values_are_refused(env):
    with pytest.raises(TopologyError, match=next(iter(env))):
        TrainerEnv.from_environ(env)


@pytest.mark.parametrize(
    "env",
    [
        {"TRAIN_MASTER_PORT": "29600", "TRAIN_MASTER_ADDR": "10.0.1.7"},
        {"TRAIN_MASTER_ADDR": "ip-10-0-1-7.ec2.internal"},
        {"TRAIN_MASTER_ADDR": "fd00::1"},
        {"TRAIN_S3_URI": "s3://stack-checkpoints/checkpoints"},
        {"TRAIN_SPOT_ENDPOINT": ""},
        {"TRAIN_SPOT_ENDPOINT": "http://127.0.0.1:1338"},
    ],
)
def test_good_values_pass(env):
    TrainerEnv.from_environ(env)


def test_an_unknown_train_variable_is_warned_about(caplog):
    env = TrainerEnv.from_environ({"TRAIN_NPROCS": "8", "TRAIN_LAUNCHER_PID": "1"})
    assert env.unknown == ("TRAIN_NPROCS",)
    env.warn_unknown()
    assert "TRAIN_NPROCS is not a variable the trainer reads" in caplog.text


# The one reader of the process environment, and the launcher, which only sets variables
# for its workers.
READER = "training/environment.py"
# code.py puts the job's code on PYTHONPATH, which the ranks inherit; cli.py names the
# tokenized data for them (TRAIN_PREPARED_DATA); text/tokenize.py turns the tokenizer's own
# threads off in the tokenizing processes it starts; fabric.py turns NCCL's logging on for
# the ranks it starts, to read back which network NCCL chose.
WRITERS = {
    "training/launcher.py",
    "training/code.py",
    "training/cli.py",
    "training/text/tokenize.py",
    "training/fabric.py",
}


def environment_reads(root: Path) -> list[str]:
    """Every place under root/training that reads os.environ or calls os.getenv (a write,
    `os.environ[name] = ...` or `os.environ.setdefault`, counts only outside WRITERS)."""
    found = []
    for path in sorted((root / "training").rglob("*.py")):
        relative = path.relative_to(root).as_posix()
        if relative == READER:
            continue
        tree = ast.parse(path.read_text())
        writes = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store):
                writes.add(id(node.value))
            if isinstance(node, ast.Attribute) and node.attr == "setdefault":
                writes.add(id(node.value))
        for node in ast.walk(tree):
            environ = (
                isinstance(node, ast.Attribute)
                and node.attr in ("environ", "getenv")
                and isinstance(node.value, ast.Name)
                and node.value.id == "os"
            ) or (
                isinstance(node, ast.ImportFrom)
                and node.module == "os"
                and any(alias.name in ("environ", "getenv") for alias in node.names)
            )
            if environ and not (relative in WRITERS and id(node) in writes):
                found.append(f"{relative}:{node.lineno}")
    return found


def test_only_the_reader_reads_the_process_environment():
    reads = environment_reads(REPO_ROOT)
    assert reads == []


def test_the_scan_finds_a_read_and_allows_the_launchers_writes(tmp_path):
    (tmp_path / "training").mkdir()
    (tmp_path / "training" / "metrics.py").write_text(
        "import os\nprice = os.environ.get('TRAIN_USD_PER_HOUR')\n"
    )
    (tmp_path / "training" / "launcher.py").write_text(
        "import os\nos.environ['TRAIN_LAUNCHER_PID'] = '1'\nos.environ.setdefault('A', '1')\n"
        "rank = os.environ['RANK']\n"
    )
    assert environment_reads(tmp_path) == ["training/launcher.py:4", "training/metrics.py:2"]


def test_a_bad_value_is_one_line_and_exit_2_before_any_rank_starts(monkeypatch, capsys):
    from training import cli

    monkeypatch.setenv("TRAIN_NNODES", "two")
    assert cli.main(["--set", "train.steps=1"]) == 2
    assert capsys.readouterr().err == "error: TRAIN_NNODES = 'two' is not an integer\n"


def test_the_reader_is_torch_free():
    """The worker reads its environment before its heavy imports."""
    code = "import sys, training.environment; print(sorted({'torch', 'boto3'} & set(sys.modules)))"
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    )
    assert result.stdout == "[]\n"


def test_an_unwritable_home_is_refused_before_any_worker_starts(tmp_path, monkeypatch, capsys):
    # DeepSpeed would compile its ops into ~/.cache/torch_extensions in every rank, and each
    # would crash there with a traceback; the launcher says it once, with the fix.
    from training.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", "/proc/no-home")
    for variable in ("XDG_CACHE_HOME", "TORCH_EXTENSIONS_DIR"):
        monkeypatch.delenv(variable, raising=False)
    assert main(["--set", "train.steps=2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: the compiled-op cache (HOME")
    assert "/proc/no-home/.cache/torch_extensions" in err[0]
    assert not (tmp_path / "runs").exists()


def test_a_full_output_disk_is_refused_in_one_line(tmp_path, monkeypatch):
    from shutil import _ntuple_diskusage as Usage

    from training import environment

    free = environment.MIN_FREE_BYTES - 1
    monkeypatch.setattr(environment.shutil, "disk_usage", lambda _: Usage(0, 0, free))
    with pytest.raises(TopologyError, match=r"'.*out' is on a full disk \(99 MiB free"):
        environment.check_job_folders(tmp_path / "out", tmp_path / "ckpt", tmp_path / "ext")
