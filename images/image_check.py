"""Runs INSIDE a built image: do the versions it carries equal what the matrix says?

  docker run --rm -i IMAGE python - --torch 2.13.0 --deepspeed 0.19.8 \\
      [--cuda 12.6 --cudnn 9.10.2.21 --nccl 2.29.3 | --cuda none] [--op fused_adam ...] \\
      < images/image_check.py

Needs no GPU: it reads the versions the libraries were built with. Prints what it found;
exits 1 naming every mismatch. Standalone on purpose (the image has no `images` package).
"""

from __future__ import annotations

import argparse
import sys


def _prefix_equal(found: str, expected: str) -> bool:
    """9.10.2 (what a library reports) matches the matrix's 9.10.2.21, and vice versa."""
    a, b = found.split("."), expected.split(".")
    n = min(len(a), len(b))
    return a[:n] == b[:n] and n >= 2


def cudnn_version(code: int) -> str:
    # cuDNN 9 encodes major*10000 + minor*100 + patch; cuDNN 8 used major*1000 + ...
    major = code // 10000 if code >= 90000 else code // 1000
    rest = code - major * (10000 if code >= 90000 else 1000)
    return f"{major}.{rest // 100}.{rest % 100}"


def found_versions() -> tuple[dict[str, str], dict[str, bool]]:
    import deepspeed
    import torch
    from deepspeed.git_version_info import installed_ops

    found = {
        "torch": torch.__version__.split("+")[0],
        "deepspeed": deepspeed.__version__.split("+")[0],
        "cuda": torch.version.cuda or "",
        "cudnn": "",
        "nccl": "",
    }
    if torch.version.cuda:
        found["cudnn"] = cudnn_version(torch.backends.cudnn.version() or 0)
        found["nccl"] = ".".join(str(part) for part in torch.cuda.nccl.version())
    return found, dict(installed_ops)


def mismatches(
    expected: dict[str, str | None], found: dict[str, str], ops: dict[str, bool], want_ops
) -> list[str]:
    problems = []
    for key, want in expected.items():
        if want is None:
            continue
        have = found[key]
        if want == "none":  # the cpu image must not carry a CUDA build of torch
            same = have == ""
        elif key in ("torch", "deepspeed"):
            same = have == want
        else:
            same = _prefix_equal(have, want)
        if not same:
            problems.append(f"{key}: the image has {have or 'none'}, the matrix says {want}")
    problems += [f"DeepSpeed op {op!r} is not pre-built" for op in want_ops if not ops.get(op)]
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--torch", required=True)
    parser.add_argument("--deepspeed", required=True)
    parser.add_argument("--cuda", help='"none": torch must be a CPU build')
    parser.add_argument("--cudnn")
    parser.add_argument("--nccl")
    parser.add_argument("--op", action="append", default=[], help="op that must be pre-built")
    args = parser.parse_args(argv)
    found, ops = found_versions()
    print(" ".join(f"{key}={value or 'none'}" for key, value in found.items()))
    print(
        "pre-built DeepSpeed ops:", ", ".join(sorted(op for op, on in ops.items() if on)) or "none"
    )
    expected = {k: getattr(args, k) for k in ("torch", "deepspeed", "cuda", "cudnn", "nccl")}
    problems = mismatches(expected, found, ops, args.op)
    for problem in problems:
        print(f"MISMATCH {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
