import subprocess

import pytest

from images.image_check import cudnn_version, mismatches, net_plugin_library, net_plugin_problems
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


def test_loadable_plugin_is_reported_with_its_api_version(tmp_path, capsys):
    library = _shared_library(
        tmp_path, "libnccl-net-ofi.so", "int ncclNetPlugin_v9 = 1; int ncclNetPlugin_v8 = 1;\n"
    )
    assert net_plugin_problems("ofi", {"NCCL_NET_PLUGIN": str(library)}) == []
    assert f"NCCL net plugin: {library} (ncclNetPlugin_v9)" in capsys.readouterr().out


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
