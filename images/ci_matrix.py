"""The CI build matrix, read from images/matrix.toml at run time.

`python -m images ci-matrix` prints {"include": [...]} as one JSON line. The static
.github/workflows/images.yml runs it in its first job and expands the output with
`fromJSON` in the build job, so no variant, tag or version is copied into the workflow.
"""

from __future__ import annotations

import json

from images.build_args import NCCL_TESTS_PREFIX, OFI_NCCL_PREFIX
from images.matrix import Matrix, Variant


def expectations(matrix: Matrix, variant: Variant) -> list[str]:
    """image_check.py's arguments: what the built image must report, from the matrix."""
    expect = ["--torch", variant.torch, "--deepspeed", variant.deepspeed]
    if variant.cuda:
        expect += ["--cuda", variant.cuda, "--cudnn", variant.cudnn, "--nccl", variant.nccl]
        expect += [
            "--net-plugin",
            "ofi",
            "--net-plugin-version",
            matrix.net_plugin(variant).version,
        ]
        expect += ["--net-plugin-dir", f"{OFI_NCCL_PREFIX}/lib"]
        expect += ["--nccl-tests", f"{NCCL_TESTS_PREFIX}/bin/all_reduce_perf"]
    else:
        expect += ["--cuda", "none", "--net-plugin", "none"]
    expect += [arg for op in matrix.ops(variant).values() for arg in ("--op", op)]
    return [*expect, "--cpu-isa", matrix.cpu_isa.march]


def entries(matrix: Matrix) -> list[dict[str, str]]:
    """One build job per variant: what its steps read as matrix.<key>."""
    return [
        {
            "variant": variant.name,
            "tag": variant.tag(matrix.release),
            "cuda": variant.cuda or "",
            "expect": " ".join(expectations(matrix, variant)),
        }
        for variant in matrix.variants
    ]


def render(matrix: Matrix) -> str:
    return json.dumps({"include": entries(matrix)}, separators=(",", ":"))
