"""Runs INSIDE a built image: do the versions it carries equal what the matrix says?

  docker run --rm -i IMAGE python - --torch 2.13.0 --deepspeed 0.19.8 \\
      [--cuda 13.0 --cudnn 9.20.0.48 --nccl 2.29.7 --net-plugin ofi \\
       --net-plugin-version 1.20.0 --net-plugin-dir /opt/amazon/ofi-nccl/lib \\
       --nccl-tests /opt/nccl-tests/bin/all_reduce_perf | --cuda none] \\
      [--op fused_adam ...] [--cpu-isa x86-64-v3] < images/image_check.py

Needs no GPU. NCCL's version is the one of the libnccl the process loaded (ncclGetVersion),
not the one torch was compiled against; the NCCL network plugin is loaded the way NCCL
loads it (by NCCL_NET_PLUGIN), and its folder and release must be the matrix's;
all_reduce_perf must link that same libnccl; every pre-built op is loaded the way DeepSpeed
loads it at run time (OpBuilder.load(), with compiling forbidden), and its host code must
target the stated instruction set and carry no AVX-512.
Prints what it found; exits 1 naming every mismatch. Standalone on purpose (the image has
no `images` package).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import re
import subprocess
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
        path, found["nccl"] = loaded_nccl()
        print(f"NCCL library: {path}")
    return found, dict(installed_ops)


def nccl_version(code: int) -> str:
    # NCCL 2.9+ encodes major*10000 + minor*100 + patch (nccl.h, NCCL_VERSION_CODE).
    return f"{code // 10000}.{code % 10000 // 100}.{code % 100}"


def loaded_nccl() -> tuple[str, str]:
    """The libnccl this process loaded (torch links it) and its ncclGetVersion."""
    path = _loaded_path("libnccl.so.2")
    code = ctypes.c_int()
    if ctypes.CDLL(path).ncclGetVersion(ctypes.byref(code)) != 0:
        return path, ""
    return path, nccl_version(code.value)


# The plugin API versions NCCL looks for, newest first (NCCL's src/plugin/net.cc).
NET_PLUGIN_SYMBOLS = [f"ncclNetPlugin_v{n}" for n in range(11, 1, -1)]


def net_plugin_library(env: dict[str, str]) -> str:
    """The library NCCL dlopens for its network plugin: NCCL_NET_PLUGIN=<name> means
    libnccl-net-<name>.so (a value that names a .so is used as it is); unset, libnccl-net.so."""
    name = env.get("NCCL_NET_PLUGIN", "")
    if not name:
        return "libnccl-net.so"
    return name if name.endswith(".so") or "/" in name else f"libnccl-net-{name}.so"


def _loaded_path(basename: str) -> str:
    """Where the dynamic loader found `basename` (this process's memory map)."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split()[-1]
            if os.path.basename(path) == basename or path.endswith(f"/{basename}"):
                return path
    return basename


def plugin_release(path: str) -> str:
    """aws-ofi-nccl's release, from the "aws-ofi-nccl X.Y.Z" it logs at init (PACKAGE_STRING,
    aws-ofi-nccl src/nccl_ofi_net.cpp)."""
    with open(path, "rb") as library:
        found = re.search(rb"aws-ofi-nccl (\d+\.\d+\.\d+)", library.read())
    return found[1].decode() if found else ""


def net_plugin_problems(
    expected: str, env: dict[str, str], version: str = "", folder: str = ""
) -> list[str]:
    """Load the plugin NCCL would load; check where it came from and its release, or say why
    NCCL would fall back to sockets."""
    library = net_plugin_library(env)
    if f"libnccl-net-{expected}.so" != os.path.basename(library):
        return [f"NCCL would load {library}, not the {expected!r} plugin (NCCL_NET_PLUGIN)"]
    try:
        handle = ctypes.CDLL(library)
    except OSError as error:
        return [f"NCCL net plugin {library} cannot be loaded: {error}"]
    symbol = next((s for s in NET_PLUGIN_SYMBOLS if hasattr(handle, s)), None)
    if symbol is None:
        return [f"{library} exports no ncclNetPlugin_v* symbol: not an NCCL net plugin"]
    path = _loaded_path(os.path.basename(library))
    release = plugin_release(path)
    print(f"NCCL net plugin: {path} ({symbol}, release {release or 'unknown'})")
    problems = []
    if folder and os.path.dirname(os.path.realpath(path)) != os.path.realpath(folder):
        problems.append(f"NCCL net plugin loaded from {path}, expected one in {folder}")
    if version and release != version:
        problems.append(f"NCCL net plugin is release {release or 'unknown'}, expected {version}")
    return problems


def nccl_tests_problems(binary: str, loaded_nccl_path: str) -> list[str]:
    """all_reduce_perf is there and the dynamic loader resolves its libnccl to the library
    torch loaded: it measures the NCCL that trains."""
    if not os.access(binary, os.X_OK):
        return [f"{binary} is missing: the image carries no all_reduce_perf"]
    linked = subprocess.run(["ldd", binary], capture_output=True, text=True, check=False).stdout
    found = re.search(r"libnccl\.so\.2 => (\S+)", linked)
    print(f"all_reduce_perf: {binary} links {found[1] if found else 'no libnccl'}")
    if found is None or found[1] == "not":
        return [f"{binary} links no libnccl.so.2 the loader can find"]
    if os.path.realpath(found[1]) != os.path.realpath(loaded_nccl_path):
        return [f"{binary} links {found[1]}, but torch loads {loaded_nccl_path}"]
    return []


def load_ops(names: list[str]) -> list[str]:
    """Load each op as DeepSpeed does at run time (OpBuilder.load: the pre-built module if
    `installed_ops` says so, else a JIT build), with the JIT build replaced by an error: an
    op that is not pre-built, or whose module does not import (a missing library, a torch
    ABI mismatch), is named. deepspeed/ops/op_builder/builder.py, OpBuilder.load."""
    from deepspeed.ops.op_builder.all_ops import ALL_OPS
    from deepspeed.ops.op_builder.builder import OpBuilder

    def refuse(self, *args, **kwargs):
        raise RuntimeError("not pre-built: DeepSpeed would compile it at run time")

    OpBuilder.jit_load = refuse
    problems = []
    for name in names:
        builder = ALL_OPS.get(name)
        if builder is None:
            problems.append(f"DeepSpeed op {name!r}: no such op for this accelerator")
            continue
        try:
            module = builder.load()
        except Exception as error:  # ImportError, RuntimeError, OSError: all say why
            problems.append(f"DeepSpeed op {name!r} does not load: {error}")
            continue
        print(f"DeepSpeed op {name}: loaded {getattr(module, '__file__', module)}")
    return problems


# DWARF producer strings GCC records with -g or -g1 (-grecord-gcc-switches is its default).
_PRODUCER = re.compile(rb"GNU C[^\x00]*")


def isa_problems(libraries: list[str], march: str) -> list[str]:
    """The pre-built ops' compile flags, as GCC recorded them: -march=<march> (or GCC's
    baseline x86-64, which ops built without -march get), and no AVX-512. A -march=native
    build records the machine's own expansion (e.g. -march=znver3 ... -mavx512f)."""
    allowed = {f"-march={march}", "-march=x86-64"}
    checked, problems = 0, []
    for path in libraries:
        with open(path, "rb") as library:
            producers = {p.decode(errors="replace") for p in _PRODUCER.findall(library.read())}
        checked += bool(producers)
        for producer in sorted(producers):
            flags = producer.split()
            marches = {flag for flag in flags if flag.startswith("-march=")}
            if not marches <= allowed or any(flag.startswith("-mavx512") for flag in flags):
                name = os.path.basename(path)
                problems.append(f"{name} built with {producer!r}, not -march={march}")
    if libraries and not checked:
        problems.append("no pre-built op records its compile flags (built without -g?)")
    return problems


def op_libraries() -> list[str]:
    """The shared objects of DeepSpeed's pre-built ops."""
    import deepspeed.ops

    root = os.path.dirname(deepspeed.ops.__file__)
    return sorted(
        os.path.join(folder, name)
        for folder, _, names in os.walk(root)
        for name in names
        if name.endswith(".so")
    )


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
    parser.add_argument(
        "--net-plugin",
        default="none",
        help='the NCCL net plugin NCCL must load (e.g. "ofi"); "none": skip (no NCCL)',
    )
    parser.add_argument("--net-plugin-version", default="", help="the plugin's release")
    parser.add_argument("--net-plugin-dir", default="", help="the folder it must load from")
    parser.add_argument("--nccl-tests", default="", help="all_reduce_perf, linked to torch's NCCL")
    parser.add_argument(
        "--op", action="append", default=[], help="op that must be pre-built and load"
    )
    parser.add_argument("--cpu-isa", help="the -march the pre-built ops' host code targets")
    args = parser.parse_args(argv)
    found, ops = found_versions()
    print(" ".join(f"{key}={value or 'none'}" for key, value in found.items()))
    print(
        "pre-built DeepSpeed ops:", ", ".join(sorted(op for op, on in ops.items() if on)) or "none"
    )
    expected = {k: getattr(args, k) for k in ("torch", "deepspeed", "cuda", "cudnn", "nccl")}
    problems = mismatches(expected, found, ops, args.op)
    if args.net_plugin == "none":
        print("NCCL net plugin: not checked (a CPU image trains over gloo; it has no NCCL)")
    else:
        problems += net_plugin_problems(
            args.net_plugin, dict(os.environ), args.net_plugin_version, args.net_plugin_dir
        )
    if args.nccl_tests:
        problems += nccl_tests_problems(args.nccl_tests, loaded_nccl()[0])
    problems += load_ops(args.op)
    if args.cpu_isa:
        libraries = op_libraries()
        print("pre-built op libraries:", ", ".join(map(os.path.basename, libraries)) or "none")
        problems += isa_problems(libraries, args.cpu_isa)
    for problem in problems:
        print(f"MISMATCH {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
