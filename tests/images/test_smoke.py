import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from images import smoke
from images.build_args import REPO_ROOT
from images.matrix import load_matrix
from tests.support.tools import require_root

MATRIX = load_matrix()
CPU = MATRIX.variant("cpu")


def good_config(variant=CPU):
    return {
        "Labels": {
            "org.opencontainers.image.version": variant.tag(MATRIX.release),
            "org.gpu-training-stack.torch": variant.torch,
            "org.gpu-training-stack.deepspeed": variant.deepspeed,
            "org.gpu-training-stack.cuda": variant.cuda or "",
        },
        "Env": [
            "PATH=/opt/venv/bin:/usr/bin",
            "TRAIN_CHECKPOINT_DIR=/checkpoints",
            f"TRAIN_MIN_DRIVER={variant.min_driver or ''}",
            "DS_ACCELERATOR=cpu",
        ],
        "User": "1000:1000",
        "Entrypoint": ["/usr/bin/tini", "-s", "--", "/usr/local/bin/entrypoint.sh"],
        "Cmd": ["python", "-m", "training"],
    }


def test_matching_config_has_no_problem():
    assert smoke.config_problems(good_config(), CPU, MATRIX.release) == []


def test_config_problems_name_each_difference():
    config = good_config()
    config["Labels"]["org.gpu-training-stack.torch"] = "2.0.0"
    config["User"] = "root"
    config["Entrypoint"] = ["python"]
    config["Env"] = ["TRAIN_CHECKPOINT_DIR=/tmp", "TRAIN_MIN_DRIVER="]
    problems = smoke.config_problems(config, CPU, MATRIX.release)
    assert problems == [
        f"label org.gpu-training-stack.torch='2.0.0', expected {CPU.torch!r}",
        "env TRAIN_CHECKPOINT_DIR='/tmp', expected '/checkpoints'",
        "env DS_ACCELERATOR=None, expected 'cpu'",
        "the image runs as root (User='root')",
        "entrypoint ['python'] is not tini: signals may not reach the trainer",
        "entrypoint ['python'] does not end in entrypoint.sh: "
        "`docker run IMAGE --config job.toml` would not train",
    ]


def write_run(tmp_path, losses, commit=True):
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    out.mkdir()
    (ckpt / "step_00000006").mkdir(parents=True)
    lines = [json.dumps({"step": i, "loss": loss}) for i, loss in enumerate(losses)]
    (out / "metrics.jsonl").write_text("\n".join([json.dumps({"event": "start"}), *lines]) + "\n")
    if commit:
        (ckpt / "step_00000006" / smoke.COMMIT_MARKER).write_text("{}")
    return out, ckpt


def test_falling_loss_and_a_committed_checkpoint_pass(tmp_path):
    assert smoke.run_problems(*write_run(tmp_path, [4.8, 4.1, 3.2])) == []


def test_flat_loss_and_an_uncommitted_checkpoint_fail(tmp_path):
    out, ckpt = write_run(tmp_path, [4.8, 4.9], commit=False)
    assert smoke.run_problems(out, ckpt) == [
        "loss did not fall: first 4.8000, last 4.9000",
        f"no committed checkpoint (commit.json) under {ckpt}",
    ]


def test_missing_metrics_is_a_problem(tmp_path):
    assert smoke.run_problems(tmp_path, tmp_path) == [
        f"no {tmp_path / 'metrics.jsonl'}: the job wrote no metrics"
    ]


class ScriptedContainer:
    """Stands in for buildah: "runs" a job by writing what a real one leaves in its mounts."""

    def __init__(self, compiles: str = ""):
        self.entrypoint = ["/usr/bin/tini", "-s", "--", "/usr/local/bin/entrypoint.sh"]
        self.default_command = [*self.entrypoint, "python", "-m", "training"]
        self.compiles, self.calls = compiles, []

    def run(self, command, mounts, env, user=""):
        self.calls.append((command, env, user))
        inside = {where: host for host, where in mounts.items()}
        lines = [json.dumps({"step": 1, "loss": 4.8}), json.dumps({"step": 2, "loss": 3.9})]
        (inside["/smoke/out"] / "metrics.jsonl").write_text("\n".join(lines) + "\n")
        (inside["/checkpoints"] / "step_00000002").mkdir()
        (inside["/checkpoints"] / "step_00000002" / smoke.COMMIT_MARKER).write_text("{}")
        if self.compiles:
            (inside[env["TORCH_EXTENSIONS_DIR"]] / self.compiles).mkdir()
        return 0


def test_training_check_fails_when_an_op_is_compiled_at_run_time(tmp_path):
    assert smoke.check_training(ScriptedContainer(), tmp_path / "a") == []
    compiling = ScriptedContainer(compiles="deepspeed_shm_comm")
    problems = smoke.check_training(compiling, tmp_path / "b")
    assert problems == ["DeepSpeed compiled deepspeed_shm_comm at run time: pre-build it"]
    ((_, env, _),) = compiling.calls
    assert env["TORCH_EXTENSIONS_DIR"] == "/smoke/extensions"
    ((command, _, _),) = compiling.calls
    assert command[:7] == compiling.default_command


def test_slurm_check_runs_as_another_user_without_the_entrypoint(tmp_path):
    container = ScriptedContainer()
    assert smoke.check_as_slurm_starts_it(container, tmp_path) == []
    ((command, env, user),) = container.calls
    assert command[:3] == ["python", "-m", "training"]  # no tini: Pyxis skips ENTRYPOINT
    assert user == "4242:4242" and not env["HOME"].startswith("/home/trainer")
    assert (tmp_path / "checkpoints").stat().st_uid == 4242


@pytest.mark.image
@pytest.mark.multiprocess
# Measured in full fresh-clone runs on 2 cores, beside the other workers: 852 s, 888 s and
# 936 s (alone on a quiet machine: 480 s), most of it compiling cpu_adam and shm_comm.
@pytest.mark.timeout(3000)
@pytest.mark.slow(
    reason="builds the cpu image with buildah from a Debian base and trains inside it",
    seconds=1200,
)
def test_cpu_image_builds_and_trains_inside():
    """The real thing: debootstrap, buildah build, versions and a 2-rank ZeRO-2 run inside."""
    require_root("buildah vfs storage, debootstrap")
    env = {**os.environ, "PYTHON": sys.executable}
    result = subprocess.run(
        ["bash", str(REPO_ROOT / "images/ci/build-and-smoke-cpu.sh")],
        env=env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert "smoke cpu: OK" in result.stdout


def test_missing_image_fails_with_one_line(tmp_path, monkeypatch, capsys):
    fake = tmp_path / "buildah"
    fake.write_text("#!/bin/sh\necho 'Error: image not known' >&2\nexit 125\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}/usr/bin:/bin")
    from images.__main__ import main

    assert main(["smoke", "cpu", "--workdir", str(tmp_path / "w")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: buildah inspect --type image... exited 125: Error: image not known"]


def test_descendants_finds_grandchildren():
    shell = subprocess.Popen(["sh", "-c", "sleep 30 & wait"])
    found: list[int] = []
    names: set[bytes] = set()
    try:
        # Until the forked child has exec'd, it is still called sh.
        for _ in range(100):
            found = smoke.descendants(shell.pid)
            names = {Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0] for pid in found}
            if names == {b"sleep"}:
                break
            time.sleep(0.05)
        assert names == {b"sleep"}
        assert shell.pid not in found
    finally:
        for pid in found:
            os.kill(pid, signal.SIGKILL)
        shell.kill()
        shell.wait()


def test_ci_script_fails_loudly_without_what_it_needs(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable, "WHEELHOUSE": str(tmp_path)}
    script = REPO_ROOT / "images/ci/build-and-smoke-cpu.sh"
    result = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True)
    assert result.returncode == 1
    reasons = ("must run as root", "is not installed", f"no CPU torch wheel in {tmp_path}")
    assert any(reason in result.stderr for reason in reasons), result.stderr
    assert "OK" not in result.stdout
