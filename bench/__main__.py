"""`python -m bench all [--quick] [--out DIR]`, or one benchmark: `python -m bench overhead`.

`python -m bench summary [--out DIR]` writes summary.md and the plots again from the JSON
results there, without measuring anything.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bench.suite import BENCHMARKS, DEFAULT_OUT, rewrite_summary, run_all, run_one


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    p.add_argument("benchmark", choices=("all", "summary", *BENCHMARKS))
    p.add_argument("--quick", action="store_true", help="small sizes and few rounds (CI)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"default {DEFAULT_OUT}")
    p.add_argument("--only", action="append", choices=BENCHMARKS, help="with all: run just these")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per benchmark")
    args = p.parse_args(argv)
    if args.benchmark == "all":
        index = run_all(
            list(args.only or BENCHMARKS), quick=args.quick, out=args.out, timeout_s=args.timeout
        )
        failed = [b["name"] for b in index["benchmarks"] if b["status"] == "failed"]
        print(f"results in {args.out}; summary: {args.out / 'summary.md'}")
        if failed:
            print(f"failed: {', '.join(failed)} (see their entries in summary.md)")
            return 1
        return 0
    if args.benchmark == "summary":
        print(rewrite_summary(args.out))
        return 0
    result = run_one(args.benchmark, quick=args.quick, out=args.out)
    json.dump(result, sys.stdout, indent=1, default=str)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
