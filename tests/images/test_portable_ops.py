"""images/portable_ops.py against the DeepSpeed op builders the venv installs."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import deepspeed.ops.op_builder
import pytest

from images.build_args import REPO_ROOT

SCRIPT = REPO_ROOT / "images" / "portable_ops.py"
# DeepSpeed's own op_builder package, laid out as in its sdist (<source>/op_builder).
OP_BUILDER = Path(deepspeed.ops.op_builder.__file__).parent
# The flags its extension is compiled with, as the build's setup.py gets them.
CXX_ARGS = (
    "from op_builder.cpu import CPUAdamBuilder\n"
    "print(' '.join(CPUAdamBuilder().builder().extra_compile_args['cxx']))"
)


def cpu_adam_flags(source: Path) -> list[str]:
    """The flags DeepSpeed would compile cpu_adam's host code with, from `source`."""
    result = subprocess.run(
        [sys.executable, "-c", CXX_ARGS],
        cwd=source,
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(source), "DS_ACCELERATOR": "cpu"},
    )
    return result.stdout.split()


@pytest.fixture
def source(tmp_path):
    shutil.copytree(OP_BUILDER, tmp_path / "op_builder", ignore=shutil.ignore_patterns("*.pyc"))
    return tmp_path


def test_unpinned_deepspeed_takes_the_build_machine_cpu(source):
    # The reason the script exists: without it the flags name this machine, not an ISA.
    flags = cpu_adam_flags(source)
    assert "-march=native" in flags and "-g" in flags


def test_pinned_ops_target_x86_64_v3_with_avx2_only(source):
    subprocess.run(
        [sys.executable, str(SCRIPT), str(source), "x86-64-v3", "__AVX256__"], check=True
    )
    flags = cpu_adam_flags(source)
    assert "-march=x86-64-v3" in flags and "-D__AVX256__" in flags
    assert "-march=native" not in flags and "-D__AVX512__" not in flags
    assert "-g" not in flags and "-g1" in flags and "-O3" in flags


def test_a_deepspeed_without_the_methods_fails_the_build(source):
    builder = source / "op_builder" / "builder.py"
    builder.write_text(builder.read_text().replace("def cpu_arch(self)", "def host_arch(self)"))
    result = subprocess.run(
        [sys.executable, str(SCRIPT), str(source), "x86-64-v3", "__AVX256__"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 1
    assert "no def cpu_arch(self); update images/portable_ops.py" in result.stderr
