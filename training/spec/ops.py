"""The DeepSpeed ops a job's settings make the engine load, and whether this machine has them.

An op is either pre-built (the images compile the ones images/matrix.toml [deepspeed_ops]
lists) or compiled when first loaded, which needs a C++ compiler and ninja, and nvcc for a
CUDA op; the images' runtime stage has none of them. So a setting whose op is neither
pre-built nor buildable here is refused before any rank starts, instead of failing in
every rank after minutes of setup. The ops follow from how DeepSpeed 0.19 picks the
optimizer (deepspeed/runtime/engine.py, get_optimizer_configuration): `torch_adam` (the
trainer's CPU runs) takes torch's AdamW; ZeRO-Offload of the optimizer takes
DeepSpeedCPUAdam (cpu_adam); otherwise FusedAdam (fused_adam). On the CPU accelerator its
communication backend loads deepspeed_shm_comm at init (deepspeed/comm/torch.py,
build_shm_op). Torch-free: the image tests import it with the matrix.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path

from training.spec.config import Config
from training.spec.selfcheck import SelfCheckError

# Ops DeepSpeed compiles with nvcc (CUDA kernels); the others need only a C++ compiler.
CUDA_OPS = frozenset({"fused_adam"})


def ops_needed(config: Config, *, on_gpu: bool) -> dict[str, str]:
    """op name (as `ds_report` and installed_ops name it) -> the setting that needs it."""
    if not on_gpu:
        return {"deepspeed_shm_comm": "DeepSpeed's CPU communication backend"}
    if config.zero.offload_optimizer:
        return {"cpu_adam": "zero.offload_optimizer = true"}
    return {"fused_adam": "the Adam optimizer on GPU (DeepSpeed's FusedAdam)"}


def can_compile(op: str, environ: Mapping[str, str]) -> bool:
    """True when a JIT build of `op` could run here: ninja, a C++ compiler, and nvcc for a
    CUDA op (torch.utils.cpp_extension looks for $CXX, else c++, and CUDA_HOME/bin/nvcc);
    `environ` holds those settings (TrainerEnv.op_build)."""
    tools = ["ninja", environ.get("CXX") or "c++"]
    if op in CUDA_OPS:
        cuda_home = environ.get("CUDA_HOME") or "/usr/local/cuda"
        tools.append(os.path.join(cuda_home, "bin", "nvcc"))
    return all(shutil.which(tool) for tool in tools)


def check_ops(
    needed: Mapping[str, str], installed: Mapping[str, bool], buildable: Callable[[str], bool]
) -> None:
    """Raise SelfCheckError naming the first needed op that is neither pre-built nor buildable."""
    for op, setting in needed.items():
        if not installed.get(op) and not buildable(op):
            raise SelfCheckError(
                f"{setting} needs DeepSpeed's {op} op, which this DeepSpeed does not carry "
                "pre-built and this machine cannot compile (no compiler in the image's runtime "
                f"stage): run an image whose matrix pre-builds {op} ([deepspeed_ops] in "
                "images/matrix.toml), or change the setting"
            )


def installed_ops(accelerator: str) -> dict[str, bool]:
    """The ops DeepSpeed was built with, when built for `accelerator` (OpBuilder.load uses
    a pre-built op only then): read from deepspeed/git_version_info_installed.py, which
    DeepSpeed's setup.py writes, without importing DeepSpeed (seconds, in the launcher)."""
    spec = importlib.util.find_spec("deepspeed")
    if spec is None or spec.origin is None:
        return {}
    path = Path(spec.origin).with_name("git_version_info_installed.py")
    if not path.is_file():
        return {}
    values = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            try:
                values[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                continue
    if values.get("accelerator_name") != accelerator:
        return {}
    return dict(values.get("installed_ops", {}))


def accelerator(environ: Mapping[str, str], *, on_gpu: bool) -> str:
    """DeepSpeed's accelerator for this run: DS_ACCELERATOR (the images set it), else what
    its detection would find (cuda with a GPU, else cpu)."""
    return environ.get("DS_ACCELERATOR") or ("cuda" if on_gpu else "cpu")
