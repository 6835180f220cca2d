"""The DeepSpeed ops a job's settings need: pre-built, buildable here, or refused at start."""

from __future__ import annotations

import os
import sys

import pytest

from tests.support.preloaded import run_module
from tests.training.jobs import TINY, job_command, job_env
from training.spec import ops
from training.spec.config import load_config
from training.spec.selfcheck import SelfCheckError

# DeepSpeed 0.19.8 deepspeed/runtime/engine.py get_optimizer_configuration: ZeRO-Offload of
# the optimizer takes DeepSpeedCPUAdam, otherwise FusedAdam; the trainer's CPU runs take
# torch's AdamW (torch_adam), and the CPU comm backend loads deepspeed_shm_comm at init.
EXPECTED = [
    (("zero.stage=2",), True, {"fused_adam"}),
    (("zero.stage=2", "zero.offload_optimizer=true"), True, {"cpu_adam"}),
    (("zero.stage=3", "zero.offload_param=true"), True, {"fused_adam"}),
    (("zero.stage=2", "zero.offload_optimizer=true"), False, {"deepspeed_shm_comm"}),
]


@pytest.mark.parametrize(("overrides", "on_gpu", "needed"), EXPECTED)
def test_each_setting_names_the_op_it_loads(overrides, on_gpu, needed):
    config = load_config(None, overrides)
    assert set(ops.ops_needed(config, on_gpu=on_gpu)) == needed


def test_an_op_neither_pre_built_nor_buildable_is_refused_in_one_line():
    needed = ops.ops_needed(load_config(None, ["zero.offload_optimizer=true"]), on_gpu=True)
    ops.check_ops(needed, {"cpu_adam": True}, buildable=lambda op: False)  # pre-built
    ops.check_ops(needed, {}, buildable=lambda op: True)  # a compiler is here
    with pytest.raises(SelfCheckError) as refused:
        ops.check_ops(needed, {"fused_adam": True}, buildable=lambda op: False)
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith("zero.offload_optimizer = true needs DeepSpeed's cpu_adam op")
    assert "[deepspeed_ops] in images/matrix.toml" in message


def test_a_build_needs_ninja_a_compiler_and_nvcc_for_a_cuda_op(tmp_path):
    tools = tmp_path / "bin"
    tools.mkdir()
    for name in ("ninja", "c++"):
        (tools / name).write_text("#!/bin/sh\n")
        (tools / name).chmod(0o755)
    cuda = tmp_path / "cuda"
    path = {"PATH": str(tools)}
    old_path = os.environ["PATH"]
    try:
        os.environ["PATH"] = str(tools)  # shutil.which reads the process's PATH
        assert ops.can_compile("cpu_adam", path)
        assert not ops.can_compile("fused_adam", {**path, "CUDA_HOME": str(cuda)})
        (cuda / "bin").mkdir(parents=True)
        (cuda / "bin" / "nvcc").write_text("#!/bin/sh\n")
        (cuda / "bin" / "nvcc").chmod(0o755)
        assert ops.can_compile("fused_adam", {**path, "CUDA_HOME": str(cuda)})
        assert not ops.can_compile("cpu_adam", {**path, "CXX": "g++-absent"})
    finally:
        os.environ["PATH"] = old_path


def test_installed_ops_count_only_for_the_accelerator_deepspeed_was_built_for(
    tmp_path, monkeypatch
):
    package = tmp_path / "deepspeed"
    package.mkdir()
    (package / "__init__.py").write_text("")
    # What DeepSpeed's setup.py writes (deepspeed/git_version_info_installed.py).
    (package / "git_version_info_installed.py").write_text(
        "version='0.19.8'\ninstalled_ops={'fused_adam': True, 'cpu_adam': True}\n"
        "accelerator_name='cuda'\ntorch_info={'version': '2.13'}\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "deepspeed", raising=False)
    assert ops.installed_ops("cuda") == {"fused_adam": True, "cpu_adam": True}
    # A CUDA image run with DS_ACCELERATOR=cpu: OpBuilder.load would JIT-build instead.
    assert ops.installed_ops("cpu") == {}
    assert ops.accelerator({"DS_ACCELERATOR": "cpu"}, on_gpu=True) == "cpu"
    assert ops.accelerator({}, on_gpu=True) == "cuda"


@pytest.mark.multiprocess
def test_the_trainer_refuses_before_any_rank_when_an_op_cannot_be_had(tmp_path):
    # No compiler on PATH and this machine's DeepSpeed pre-builds nothing: the CPU run's
    # deepspeed_shm_comm can be neither loaded nor built.
    empty = tmp_path / "no-tools"
    empty.mkdir()
    env = {**job_env(tmp_path), "PATH": str(empty)}
    env.pop("CXX", None)
    result = run_module("training", job_command(*TINY)[3:], env=env)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr[-3000:]
    assert len(lines) == 1 and lines[0].startswith("error: DeepSpeed's CPU communication")
    assert "deepspeed_shm_comm" in lines[0]
    assert not (tmp_path / "metrics.jsonl").exists()
