"""training/private_apis.py relies on DeepSpeed and torch internals: each fact it states is
checked against the installed libraries here, and no other module may use a private name of
either (the bar the module exists for)."""

from __future__ import annotations

import ast
import importlib.util
import inspect
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import deepspeed
import torch
from deepspeed.checkpoint import ds_to_universal
from deepspeed.ops.op_builder.builder import OpBuilder
from deepspeed.runtime.engine import DeepSpeedEngine

from training import private_apis

REPO = Path(__file__).resolve().parents[2]
PRODUCT_PACKAGES = ("training", "infra", "common", "images", "bench")
ADAPTER = REPO / "training" / "private_apis.py"


def test_the_adapter_is_written_against_the_installed_deepspeed():
    # A new DeepSpeed: re-check every fact below against its source, then bump these.
    assert deepspeed.__version__ == "0.19.8"
    assert "DeepSpeed 0.19.8" in ADAPTER.read_text()


def test_save_checkpoint_writes_every_file_through_the_swapped_attribute():
    name = private_apis.CHECKPOINT_ENGINE_ATTRIBUTE
    save = inspect.getsource(DeepSpeedEngine.save_checkpoint)
    assert f"self.{name}.create(" in save and f"self.{name}.commit(" in save
    for helper in ("_save_checkpoint", "_save_zero_checkpoint"):
        assert f"self.{name}.save(" in inspect.getsource(getattr(DeepSpeedEngine, helper))
    # Set once, where the config is read: nothing resets it between our swap and the save.
    setters = [
        attr
        for attr, member in vars(DeepSpeedEngine).items()
        if callable(member) and f"self.{name} = " in inspect.getsource(member)
    ]
    assert setters == ["__init__", "_configure_checkpointing"]  # None, then the configured one


def test_the_swap_puts_the_configured_engine_back_even_when_the_save_fails():
    engine = SimpleNamespace(checkpoint_engine="configured")
    try:
        with private_apis.checkpoint_engine_swapped(engine, "writer"):
            assert engine.checkpoint_engine == "writer"
            raise OSError("disk full")
    except OSError:
        pass
    assert engine.checkpoint_engine == "configured"


def test_op_builds_are_seen_through_jit_load(monkeypatch):
    assert list(inspect.signature(OpBuilder.jit_load).parameters) == ["self", "verbose"]
    # Every op loads through jit_load: OpBuilder.load calls it when the op is not prebuilt.
    assert "self.jit_load(" in inspect.getsource(OpBuilder.load)
    monkeypatch.setattr(OpBuilder, "jit_load", lambda self, verbose=True: f"{self.name} loaded")
    seen = []
    private_apis.on_op_build(seen.append, lambda start, end: seen.append(end >= start))
    assert OpBuilder.jit_load(SimpleNamespace(name="fused_adam")) == "fused_adam loaded"
    assert seen == ["fused_adam", True]


def test_each_kind_of_engine_reads_its_own_form_of_a_universal_checkpoint():
    """The facts convert_to_universal writes both forms for, and the step sharing
    training/checkpoint/resume.py undoes."""
    from deepspeed.checkpoint import universal_checkpoint
    from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

    names = inspect.getsource(DeepSpeedEngine._get_ckpt_name)
    assert '"zero_pp_rank_{}".format(pp_rank)' in names
    assert '"mp_rank_" + mp_rank_str + "_model_states.pt"' in names
    assert 'pp_placeholder="0" if self.load_universal_checkpoint()' in inspect.getsource(
        DeepSpeedEngine._get_all_ckpt_names
    )
    assert "if not self.load_universal_checkpoint():\n            self.load_module_state_dict(" in (
        inspect.getsource(DeepSpeedEngine._load_checkpoint)
    )
    zero3 = inspect.getsource(
        DeepSpeedZeroOptimizer_Stage3.load_hp_checkpoint_state_from_checkpoint_dir_stage3
    )
    assert "optim_sd[OPTIMIZER_STATE_DICT]['state'][0]['step']" in zero3
    # One step tensor for every group, and group 0's settings for every group.
    assert "self.optimizer.state[fp32_param]['step'] = state_step" in zero3
    assert 'optim_sd[OPTIMIZER_STATE_DICT]["param_groups"][0].items()' in zero3
    assert "ckpt_dict[PARAM]" in inspect.getsource(
        DeepSpeedZeroOptimizer_Stage3.load_hp_checkpoint_state
    )
    assert "assert ckpt_version" in inspect.getsource(DeepSpeedZeroOptimizer._load_global_state)
    zero12 = inspect.getsource(universal_checkpoint.load_hp_checkpoint_state)
    assert 'if key == "step":' in zero12 and "full_hp_param = ckpt_dict[PARAM]" in zero12


def test_stage_0_keeps_its_optimizer_state_where_its_converters_read_and_write_it():
    """The facts universal_from_stage_0 and load_universal_into_stage_0 rely on."""
    from deepspeed.runtime.fp16.fused_optimizer import FP16_Optimizer
    from deepspeed.runtime.fp16.unfused_optimizer import FP16_UnfusedOptimizer

    save = inspect.getsource(DeepSpeedEngine._common_checkpoint_state)
    assert "optimizer=self.optimizer.state_dict() if self.optimizer and not zero_optimizer" in (
        save
    )
    fused, unfused = inspect.getsource(FP16_Optimizer), inspect.getsource(FP16_UnfusedOptimizer)
    assert f"state_dict['{private_apis.FLAT_COPIES}'] = self.{private_apis.FLAT_COPIES}" in fused
    assert f"state_dict['{private_apis.COPIES}'] = self.{private_apis.COPIES}" in unfused
    # Flattened without padding, the group's parameters in order.
    assert "_flatten_dense_tensors([p.clone().detach() for p in self.fp16_groups[i]])" in fused
    for source in (fused, unfused):
        assert f"self.{private_apis.LOW_PRECISION_GROUPS}.append(trainable)" in source
        assert "state_dict[OPTIMIZER_STATE_DICT] = self.optimizer.state_dict()" in source
    assert "self.param_names = {param: name for name, param in model.named_parameters()}" in (
        inspect.getsource(DeepSpeedEngine.__init__)
    )
    # A universal load ends in update_lp_params, which no stage 0 optimizer has; its module
    # state is skipped through the public custom_load_fn.
    assert "self.optimizer.update_lp_params()" in inspect.getsource(DeepSpeedEngine.load_checkpoint)
    assert not any(hasattr(o, "update_lp_params") for o in (FP16_Optimizer, FP16_UnfusedOptimizer))
    assert "custom_load_fn(src=module_state_dict, dst=self.module)" in inspect.getsource(
        DeepSpeedEngine.load_module_state_dict
    )
    # Into stage 0, each parameter through DeepSpeed's per-parameter loader, which reads of
    # its _hp_mapping only what _WholeSlice gives, and the tensor rank the way ZeRO asks.
    from deepspeed.checkpoint import universal_checkpoint
    from deepspeed.runtime.base_optimizer import ZeROOptimizer

    one = inspect.getsource(universal_checkpoint.load_hp_checkpoint_state)
    assert [line.strip() for line in one.splitlines() if "hp_mapping" in line] == [
        "hp_mapping = self._hp_mapping",
        "hp_mapping.optim_fragment = {}",
        "lp_frag_address = hp_mapping.lp_fragment_address",
        "dst_tensor = hp_mapping.get_hp_fragment()",
        "hp_mapping.optim_fragment[key] = tp_hp_fragment.clone().detach()",
    ]
    ranks = inspect.getsource(ZeROOptimizer.load_hp_checkpoint_state_from_checkpoint_dir)
    assert "tp_rank = bwc_tensor_model_parallel_rank(mpu=self.mpu)" in ranks
    # A tensor-parallel run's slices are written as ZeRO's fragments and joined by the merge.
    assert list(inspect.signature(ds_to_universal.dump_param_fragment).parameters) == [
        "dir", "tp_index", "dp_index", "state_name", "state_flat_tensor", "param_name",
        "offset", "numel",
    ]  # fmt: skip
    assert list(inspect.signature(ds_to_universal.merge_tp_slices).parameters) == [
        "uc_info", "dir", "slice_dir", "tp_degree", "name_and_shapes",
    ]  # fmt: skip
    assert '_merge_zero_shards(slice_base_path, "step", tp_degree, per_tp_shapes)' in (
        inspect.getsource(ds_to_universal.merge_tp_slices)
    )


def test_the_universal_conversion_takes_exactly_the_arguments_its_parser_builds(monkeypatch):
    assert list(inspect.signature(ds_to_universal.main).parameters) == ["args"]
    monkeypatch.setattr(
        sys,
        "argv",
        ["ds_to_universal", "--input_folder", "a", "--output_folder", "b"],
    )
    parsed = vars(ds_to_universal.parse_arguments())
    ours = vars(private_apis.universal_conversion_arguments(Path("a"), Path("b")))
    assert set(ours) == set(parsed)
    assert {key: type(value) for key, value in ours.items()} == {
        key: type(value) for key, value in parsed.items()
    }


def test_torch_has_a_way_to_empty_its_host_cache():
    public = getattr(torch.accelerator, "empty_host_cache", None)
    assert callable(public) or callable(getattr(torch._C, "_host_emptyCache", None))


def _private_uses(path: Path) -> list[str]:
    """`._`-prefixed names of torch or deepspeed that `path` imports or reads."""
    tree = ast.parse(path.read_text())
    roots = {"torch", "deepspeed"}
    aliases = set(roots)
    found, inner = [], set()

    def private(dotted: str) -> bool:
        return any(part.startswith("_") and not part.startswith("__") for part in dotted.split("."))

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in roots:
                    aliases.add((alias.asname or alias.name).split(".")[0])
                    if private(alias.name):
                        found.append(alias.name)
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module.split(".")[0] in roots:
                names = [f"{node.module}.{alias.name}" for alias in node.names]
                found += [name for name in names if private(name)]
        elif isinstance(node, ast.Attribute) and id(node) not in inner:
            parts, value = [node.attr], node.value
            while isinstance(value, ast.Attribute):
                inner.add(id(value))  # reported with the outermost attribute only
                parts.append(value.attr)
                value = value.value
            # The local name of the import may be anything; what follows it is the library's.
            if isinstance(value, ast.Name) and value.id in aliases and private(".".join(parts)):
                found.append(".".join([value.id, *reversed(parts)]))
    return found


_DEFERRED_IMPORT = """
import sys
import torch
from deepspeed.runtime import compiler
shipped = compiler.compile() is torch.compile
from training import private_apis
private_apis.compile_when_first_called()
from deepspeed.runtime.zero.muon import original_muon
print(shipped, "torch._inductor.compile_fx" in sys.modules)
"""


def test_deepspeeds_muon_kernels_are_imported_without_inductor():
    from deepspeed.runtime.zero import utils

    # Imported on every ZeRO run, each kernel handed to torch.compile at import as shipped.
    assert "muon_optimizer import" in inspect.getsource(utils.is_zero_supported_optimizer)
    muon = importlib.util.find_spec("deepspeed.runtime.zero.muon.original_muon").origin
    assert Path(muon).read_text().count("@compiler.compile()\ndef ") == 3
    # A fresh process: nothing else has imported Inductor or installed the deferral yet.
    imported = subprocess.run(
        [sys.executable, "-c", _DEFERRED_IMPORT], capture_output=True, text=True, check=True
    )
    shipped_is_torch_compile, inductor_imported = imported.stdout.split()[-2:]
    assert (shipped_is_torch_compile, inductor_imported) == ("True", "False")


def test_a_deferred_kernel_is_compiled_once_at_its_first_call(monkeypatch):
    from deepspeed.runtime import compiler

    monkeypatch.setattr(compiler, "compile", compiler.compile)  # put back after the test
    compiled = []

    def record_compile(function):
        compiled.append(function)
        return lambda x: function(x) + 1  # tells the compiled path from the eager one

    monkeypatch.setattr(torch, "compile", record_compile)
    private_apis.compile_when_first_called()
    private_apis.compile_when_first_called()  # a second install wraps nothing twice

    def double(x):
        return 2 * x

    kernel = compiler.compile()(double)
    assert compiled == [] and kernel.__name__ == "double"
    assert [kernel(1), kernel(2)] == [3, 5] and compiled == [double]


def test_no_module_but_the_adapter_uses_a_private_name_of_torch_or_deepspeed():
    uses = {
        str(path.relative_to(REPO)): _private_uses(path)
        for package in PRODUCT_PACKAGES
        for path in sorted((REPO / package).rglob("*.py"))
        if path != ADAPTER
    }
    assert {path: names for path, names in uses.items() if names} == {}
    assert _private_uses(ADAPTER) == ["torch._C._host_emptyCache"]  # the scan sees one


def test_the_scan_sees_private_imports_and_aliases(tmp_path):
    module = tmp_path / "m.py"
    module.write_text(
        "import torch as t\nfrom deepspeed.runtime._x import y\nfrom torch import _C\n"
        "t._C._y()\nt.cuda.synchronize()\n"
    )
    assert sorted(_private_uses(module)) == ["deepspeed.runtime._x.y", "t._C._y", "torch._C"]
