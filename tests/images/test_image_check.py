import subprocess
import sys
from pathlib import Path

import pytest

from images.image_check import (
    cudnn_version,
    isa_problems,
    loaded_nccl,
    mismatches,
    nccl_tests_problems,
    nccl_version,
    net_plugin_library,
    net_plugin_problems,
)
from tests.support.tools import require_tool

FOUND = {
    "torch": "2.13.0",
    "deepspeed": "0.19.8",
    "cuda": "12.6",
    "cudnn": "9.10.2",
    "nccl": "2.29.3",
}
OPS = {"fused_adam": True, "cpu_adam": True, "fused_lamb": False}


@pytest.mark.parametrize(
    ("code", "version"), [(91002, "9.10.2"), (90100, "9.1.0"), (8902, "8.9.2")]
)
def test_cudnn_version_decodes_both_encodings(code, version):
    assert cudnn_version(code) == version


def test_matching_image_has_no_mismatch():
    expected = {
        "torch": "2.13.0",
        "deepspeed": "0.19.8",
        "cuda": "12.6",
        "cudnn": "9.10.2.21",
        "nccl": "2.29.3",
    }
    assert mismatches(expected, FOUND, OPS, ["fused_adam", "cpu_adam"]) == []


def test_every_mismatch_is_named():
    expected = {
        "torch": "2.13.1",
        "deepspeed": "0.19.8",
        "cuda": "13.0",
        "cudnn": "9.20.0.48",
        "nccl": None,
    }
    problems = mismatches(expected, FOUND, OPS, ["fused_adam", "fused_lamb"])
    assert problems == [
        "torch: the image has 2.13.0, the matrix says 2.13.1",
        "cuda: the image has 12.6, the matrix says 13.0",
        "cudnn: the image has 9.10.2, the matrix says 9.20.0.48",
        "DeepSpeed op 'fused_lamb' is not pre-built",
    ]


def test_cpu_image_without_cuda_fails_a_cuda_expectation():
    found = {**FOUND, "cuda": "", "cudnn": "", "nccl": ""}
    problems = mismatches({"cuda": "12.6"}, found, OPS, [])
    assert problems == ["cuda: the image has none, the matrix says 12.6"]


def test_cpu_expectation_fails_a_cuda_build_of_torch():
    assert mismatches({"cuda": "none"}, {**FOUND, "cuda": ""}, OPS, []) == []
    assert mismatches({"cuda": "none"}, FOUND, OPS, []) == [
        "cuda: the image has 12.6, the matrix says none"
    ]


def _shared_library(tmp_path, name, source):
    """A real shared library built with the C compiler, for the loader to open."""
    cc = require_tool("cc", "gcc")
    c_file = tmp_path / "plugin.c"
    c_file.write_text(source)
    library = tmp_path / name
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(library), str(c_file)], check=True)
    return library


def test_net_plugin_name_follows_nccl_net_plugin():
    assert net_plugin_library({}) == "libnccl-net.so"
    assert net_plugin_library({"NCCL_NET_PLUGIN": "ofi"}) == "libnccl-net-ofi.so"
    assert net_plugin_library({"NCCL_NET_PLUGIN": "/x/libnccl-net-ofi.so"}) == (
        "/x/libnccl-net-ofi.so"
    )


PLUGIN_SOURCE = (
    "int ncclNetPlugin_v9 = 1; int ncclNetPlugin_v8 = 1;\n"
    'const char *package = "Initializing aws-ofi-nccl 1.19.2";\n'
)


def test_loadable_plugin_is_reported_with_its_api_version_and_release(tmp_path, capsys):
    library = _shared_library(tmp_path, "libnccl-net-ofi.so", PLUGIN_SOURCE)
    env = {"NCCL_NET_PLUGIN": str(library)}
    assert net_plugin_problems("ofi", env, "1.19.2", str(tmp_path)) == []
    out = capsys.readouterr().out
    assert f"NCCL net plugin: {library} (ncclNetPlugin_v9, release 1.19.2)" in out


def test_plugin_of_another_release_or_folder_fails(tmp_path):
    library = _shared_library(tmp_path, "libnccl-net-ofi.so", PLUGIN_SOURCE)
    env = {"NCCL_NET_PLUGIN": str(library)}
    assert net_plugin_problems("ofi", env, "1.17.1", "/opt/amazon/ofi-nccl/lib") == [
        f"NCCL net plugin loaded from {library}, expected one in /opt/amazon/ofi-nccl/lib",
        "NCCL net plugin is release 1.19.2, expected 1.17.1",
    ]


@pytest.mark.parametrize(("code", "version"), [(22907, "2.29.7"), (22705, "2.27.5")])
def test_nccl_version_decodes_nccl_version_code(code, version):
    assert nccl_version(code) == version


def test_nccl_version_comes_from_the_loaded_library(tmp_path, monkeypatch):
    # A stand-in libnccl.so.2 with ncclGetVersion: what is reported is what it answers.
    library = _shared_library(
        tmp_path, "libnccl.so.2", "int ncclGetVersion(int *v) { *v = 22907; return 0; }\n"
    )
    monkeypatch.setattr("images.image_check._loaded_path", lambda name: str(library))
    assert loaded_nccl() == (str(library), "2.29.7")


def _compiled_op(tmp_path, name, *flags):
    cxx = require_tool("g++", "g++")
    source = tmp_path / "op.cpp"
    source.write_text(
        "float f(const float *a, int n) { float s = 0; while (n--) s += a[n]; return s; }\n"
    )
    library = tmp_path / name
    command = [cxx, "-O3", "-g", *flags, "-shared", "-fPIC", "-o", str(library), str(source)]
    subprocess.run(command, check=True)
    return str(library)


def test_ops_built_for_the_stated_isa_or_gcc_baseline_pass(tmp_path):
    op = _compiled_op(tmp_path, "cpu_adam_op.so", "-march=x86-64-v3", "-D__AVX256__")
    baseline = _compiled_op(tmp_path, "shm_comm_op.so", "-O2")  # no -march: x86-64
    assert isa_problems([op, baseline], "x86-64-v3") == []


def test_ops_built_with_avx512_or_another_march_fail(tmp_path):
    avx512 = _compiled_op(tmp_path, "a.so", "-march=x86-64-v3", "-mavx512f")
    other = _compiled_op(tmp_path, "b.so", "-march=x86-64-v2")
    problems = isa_problems([avx512, other], "x86-64-v3")
    assert len(problems) == 2
    assert problems[0].startswith("a.so built with 'GNU C++") and "-mavx512f" in problems[0]
    assert problems[1].startswith("b.so built with") and "-march=x86-64-v2" in problems[1]


def test_ops_without_recorded_flags_cannot_pass(tmp_path):
    stripped = _compiled_op(tmp_path, "shm.so", "-g0")
    assert isa_problems([stripped], "x86-64-v3") == [
        "no pre-built op records its compile flags (built without -g?)"
    ]


def test_missing_or_broken_plugin_fails(tmp_path):
    missing = net_plugin_problems("ofi", {"NCCL_NET_PLUGIN": str(tmp_path / "libnccl-net-ofi.so")})
    assert len(missing) == 1 and "cannot be loaded" in missing[0]
    not_a_plugin = _shared_library(tmp_path, "libnccl-net-ofi.so", "int unrelated = 1;\n")
    problems = net_plugin_problems("ofi", {"NCCL_NET_PLUGIN": str(not_a_plugin)})
    assert problems == [
        f"{not_a_plugin} exports no ncclNetPlugin_v* symbol: not an NCCL net plugin"
    ]
    # Unset, NCCL looks for libnccl-net.so: the check names that it is not the ofi plugin.
    assert "not the 'ofi' plugin" in net_plugin_problems("ofi", {})[0]


def test_an_op_that_is_not_pre_built_fails_to_load_instead_of_compiling():
    # This machine's DeepSpeed is a plain pip install: no op is pre-built, so loading
    # cpu_adam would JIT-compile it. The check must refuse that (in its own process: it
    # replaces OpBuilder.jit_load), and name an op the accelerator does not have.
    script = (
        "from images.image_check import load_ops; "
        "print('\\n'.join(load_ops(['cpu_adam', 'no_such_op'])))"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    # DeepSpeed logs its accelerator choice on stdout too.
    lines = [line for line in result.stdout.splitlines() if line.startswith("DeepSpeed op")]
    assert lines == [
        "DeepSpeed op 'cpu_adam' does not load: not pre-built: DeepSpeed would compile it at "
        "run time",
        "DeepSpeed op 'no_such_op': no such op for this accelerator",
    ]


def _linked_binary(tmp_path: Path, library_dir: Path) -> Path:
    """A program linked to a libnccl.so.2 in library_dir, found there through its RUNPATH."""
    cc = require_tool("cc", "gcc")
    library_dir.mkdir(parents=True, exist_ok=True)
    source = tmp_path / "nccl.c"
    source.write_text("int ncclGetVersion(int *v) { *v = 22907; return 0; }\n")
    subprocess.run(
        [cc, "-shared", "-fPIC", "-Wl,-soname,libnccl.so.2", "-o", library_dir / "libnccl.so.2",
         source],
        check=True,
    )  # fmt: skip
    main = tmp_path / "main.c"
    main.write_text(
        "int ncclGetVersion(int *); int main(void) { int v; return ncclGetVersion(&v); }\n"
    )
    (library_dir / "libnccl.so").symlink_to("libnccl.so.2")
    binary = tmp_path / "all_reduce_perf"
    subprocess.run(
        [cc, "-o", binary, main, f"-L{library_dir}", "-lnccl", f"-Wl,-rpath,{library_dir}"],
        check=True,
    )
    return binary


def test_all_reduce_perf_must_link_the_nccl_torch_loads(tmp_path):
    binary = _linked_binary(tmp_path, tmp_path / "venv-nccl")
    assert nccl_tests_problems(str(binary), str(tmp_path / "venv-nccl" / "libnccl.so.2")) == []
    other = str(tmp_path / "system" / "libnccl.so.2")
    assert nccl_tests_problems(str(binary), other) == [
        f"{binary} links {tmp_path / 'venv-nccl' / 'libnccl.so.2'}, but torch loads {other}"
    ]
    assert nccl_tests_problems(str(tmp_path / "absent"), other) == [
        f"{tmp_path / 'absent'} is missing: the image carries no all_reduce_perf"
    ]
