"""Runs INSIDE the image build: make DeepSpeed's pre-built ops target one stated CPU ISA.

  python portable_ops.py DEEPSPEED_SOURCE_DIR x86-64-v3 __AVX256__

DeepSpeed compiles the host code of its ops (cpu_adam, ...) with the build machine's
`-march=native` and an AVX-512 or AVX2 define picked from that machine's CPU flags
(0.19.8 op_builder/builder.py: OpBuilder.cpu_arch, OpBuilder.simd_width, used by
op_builder/cpu/builder.py CPUOpBuilder.cxx_args). Built on an AVX-512 CI runner, an image
would die with an illegal instruction on a host without AVX-512, and two builds of one
commit would differ. This appends an override of both methods to the unpacked sdist's
op_builder/builder.py before it is built.

It also builds the ops with GCC's minimal debug information (-g1: function names and line
tables, enough for a backtrace) instead of the full -g DeepSpeed adds to cpu_adam's and the
CUDA ops' host flags (op_builder/cpu/builder.py CPUOpBuilder.cxx_args, builder.py
OpBuilder.cxx_args). Every builder passes those flags through `strip_empty_entries`
(builder.py OpBuilder.builder, CUDAOpBuilder.builder; cpu/builder.py CPUOpBuilder.builder),
where the flag is swapped. -g1 still records the compile flags that images/image_check.py
reads back. Measured on cpu_adam_impl.cpp, 2 cores: 43 s of compiling with -g, 32 s with
-g1, and an object 5 times smaller.

Standalone on purpose (the build has no `images` package); refuses a source tree whose
builder lacks any of the three methods, so a DeepSpeed that renames one fails the build
instead of silently going native (or full debug) again.
"""

from __future__ import annotations

import sys
from pathlib import Path

OVERRIDDEN = ("def cpu_arch(self)", "def simd_width(self)", "def strip_empty_entries(self")


def override(march: str, simd: str) -> str:
    return (
        "\n\n# Appended by the image build (images/portable_ops.py): the pre-built ops' host\n"
        "# code targets a stated instruction set, not the build machine's.\n"
        f'OpBuilder.cpu_arch = lambda self: "-march={march}"\n'
        f'OpBuilder.simd_width = lambda self: "-D{simd}"\n'
        "# ... with minimal debug information (-g1), which still records the flags.\n"
        "_strip_empty_entries = OpBuilder.strip_empty_entries\n"
        "OpBuilder.strip_empty_entries = lambda self, args: [\n"
        '    "-g1" if arg == "-g" else arg for arg in _strip_empty_entries(self, args)\n'
        "]\n"
    )


def pin(source: Path, march: str, simd: str) -> Path:
    builder = source / "op_builder" / "builder.py"
    text = builder.read_text()
    missing = [method for method in OVERRIDDEN if method not in text]
    if missing:
        raise SystemExit(f"{builder}: no {', '.join(missing)}; update images/portable_ops.py")
    builder.write_text(text + override(march, simd))
    return builder


if __name__ == "__main__":
    if len(sys.argv) != 4:
        raise SystemExit("usage: python portable_ops.py DEEPSPEED_SOURCE_DIR MARCH SIMD")
    print(f"pinned {pin(Path(sys.argv[1]), sys.argv[2], sys.argv[3])}")
