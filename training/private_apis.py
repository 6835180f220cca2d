"""Every use of a DeepSpeed or torch name outside their public APIs, in one place.

The trainer uses DeepSpeed and torch through their public APIs, except for the needs below,
which neither library offers a public way to meet: writing a checkpoint through the
trainer's writer, timing op builds, converting checkpoints between layouts and ZeRO stages
(stage 0 included), emptying the host cache, and deferring DeepSpeed's compiled kernels.
Each function names the version it was written against and the source lines it relies on;
tests/training/test_private_apis.py checks each of those facts against the installed
library, so a release that changes one fails that test, not a training run.

Written against DeepSpeed 0.19.8 (requirements-train.txt) and torch 2.10 (the cu128 image)
to 2.13 (the CPU image).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

# DeepSpeed 0.19.8, deepspeed/runtime/engine.py: `save_checkpoint` (line 4869) and the
# helpers it calls write every file through `self.checkpoint_engine` (lines 4899, 4909,
# 5289, 5354, 5404, 5564), an attribute set once in `_configure_checkpointing` (line 1902)
# from the `checkpoint.writer` config (create_checkpoint_engine,
# deepspeed/runtime/checkpoint_engine/utils.py); no argument or config installs another.
CHECKPOINT_ENGINE_ATTRIBUTE = "checkpoint_engine"


@contextlib.contextmanager
def checkpoint_engine_swapped(engine, writer) -> Iterator[None]:
    """`engine.save_checkpoint` writes through `writer` (a DeepSpeed CheckpointEngine) inside
    this block; the configured engine is put back after it."""
    configured = getattr(engine, CHECKPOINT_ENGINE_ATTRIBUTE)
    setattr(engine, CHECKPOINT_ENGINE_ATTRIBUTE, writer)
    try:
        yield
    finally:
        setattr(engine, CHECKPOINT_ENGINE_ATTRIBUTE, configured)


def on_op_build(began: Callable[[str], None], ended: Callable[[float, float], None]) -> None:
    """Call `began(op name)` when DeepSpeed JIT-loads an op, and `ended(start, end)` (Unix
    times) when the load returns.

    DeepSpeed 0.19.8 loads every JIT op through `OpBuilder.jit_load(self, verbose=True)`
    (deepspeed/ops/op_builder/builder.py, line 568) and has no hook to be told; the method is
    wrapped, once per process.
    """
    import time

    from deepspeed.ops.op_builder.builder import OpBuilder

    jit_load = OpBuilder.jit_load

    def timed_jit_load(self, *args, **kwargs):
        began(self.name)
        start = time.time()
        try:
            return jit_load(self, *args, **kwargs)
        finally:
            ended(start, time.time())

    OpBuilder.jit_load = timed_jit_load


def universal_conversion_arguments(input_folder: Path, output_folder: Path) -> argparse.Namespace:
    """The arguments of DeepSpeed's ds_to_universal for one conversion in this process.

    DeepSpeed 0.19.8, deepspeed/checkpoint/ds_to_universal.py: the converter is a script
    whose `main(args)` (line 1156) takes the namespace its `parse_arguments()` (line 71)
    builds from sys.argv; there is no function that takes the folders. One worker each: the
    conversion runs inside a training rank, which must not fork a pool.
    """
    return argparse.Namespace(
        input_folder=str(input_folder),
        output_folder=str(output_folder),
        num_extract_workers=1,
        num_merge_workers=1,
        keep_temp_folder=False,
        strict=True,
        inject_missing_state=False,
    )


# What a universal checkpoint holds depends on the ZeRO stage that saved it, and each kind of
# engine reads its own form (DeepSpeed 0.19.8):
# - The model states. A ZeRO-3 engine reads zero_pp_rank_<dp>_mp_rank_<mp>_model_states.pt,
#   a ZeRO-0/1/2 engine mp_rank_<mp>_model_states.pt (runtime/engine.py `_get_ckpt_name`),
#   and ds_to_universal copies the source's under the source's name. Loading a universal
#   checkpoint an engine takes the first partition's (`_get_all_ckpt_names`, pp_placeholder
#   "0") for its metadata only: the step counters, the LR scheduler, the client state; the
#   weights come from the zero/ folder (`_load_checkpoint`: `if not
#   self.load_universal_checkpoint(): self.load_module_state_dict(...)`).
# - The optimizer's common state, zero/optimizer_state.pt. A ZeRO-1/2 engine asserts its
#   ds_version (zero/stage_1_and_2.py `_load_global_state`) and reads Adam's step from each
#   parameter's step.pt (checkpoint/universal_checkpoint.py `load_hp_checkpoint_state`); a
#   ZeRO-3 engine reads the step from its optimizer_state_dict's state[0] and the group
#   settings from its param_groups (zero/stage3.py
#   `load_hp_checkpoint_state_from_checkpoint_dir_stage3`).
#   A conversion from ZeRO-1/2 writes only the first form, one from ZeRO-3 only the second.
# - Each parameter's fp32 weights and Adam moments, zero/<name>/<key>.pt. A ZeRO-1/2 engine
#   reads a {"param": tensor of the parameter's shape, "cat_dim": ...} record
#   (universal_checkpoint.py `load_hp_checkpoint_state`), a ZeRO-3 one either that or a bare
#   tensor (stage3.py `load_hp_checkpoint_state`); a conversion from ZeRO-3 writes flat bare
#   tensors, whose shapes its model states list under "param_shapes".
PARTITIONED_MODEL_STATES = "zero_pp_rank_0_mp_rank_{mp}_model_states.pt"
WHOLE_MODEL_STATES = "mp_rank_{mp}_model_states.pt"
COMMON_OPTIMIZER_STATE = "zero/optimizer_state.pt"
STEP = "step"
STEP_FILE = f"{STEP}.pt"
PARAMETER_STATES = ("fp32", "exp_avg", "exp_avg_sq")
MOMENTS = PARAMETER_STATES[1:]


def convert_to_universal(input_folder: Path, output_folder: Path) -> None:
    """DeepSpeed's universal checkpoint of `input_folder`, written to `output_folder`
    (https://www.deepspeed.ai/tutorials/universal-checkpointing/), in both stages' forms
    (above): it loads at any ZeRO stage from 1 to 3 whatever the source's."""
    import torch
    from deepspeed.checkpoint import ds_to_universal
    from deepspeed.checkpoint.constants import OPTIMIZER_STATE_DICT

    ds_to_universal.main(universal_conversion_arguments(input_folder, output_folder))
    common_path = output_folder / COMMON_OPTIMIZER_STATE
    common = torch.load(common_path, weights_only=False)
    if OPTIMIZER_STATE_DICT in common:  # saved at ZeRO-3
        _add_the_zero_1_2_form(output_folder, common)
    else:
        _add_the_zero_3_form(common, output_folder)
    torch.save(common, common_path)
    for name in list(output_folder.glob("*_model_states.pt")):
        other = (
            WHOLE_MODEL_STATES
            if name.name.startswith("zero_pp_rank_")
            else PARTITIONED_MODEL_STATES
        )
        mp = name.name.removesuffix("_model_states.pt").rsplit("_", 1)[1]
        if not (output_folder / other.format(mp=mp)).exists():
            os.link(name, output_folder / other.format(mp=mp))


def _add_the_zero_3_form(common: dict, folder: Path) -> None:
    """Adam's step and the group settings where a ZeRO-3 engine reads them."""
    import torch
    from deepspeed.checkpoint.constants import OPTIMIZER_STATE_DICT, PARAM_GROUPS

    step_file = next((folder / "zero").glob(f"*/{STEP_FILE}"))
    step = torch.load(step_file, weights_only=False)
    common[OPTIMIZER_STATE_DICT] = {
        "state": {0: {"step": step}},
        PARAM_GROUPS: common[PARAM_GROUPS],
    }


def _add_the_zero_1_2_form(folder: Path, common: dict) -> None:
    """The DeepSpeed version, each parameter's step, and its tensors shaped as records,
    where a ZeRO-1/2 engine reads them; one file in memory at a time."""
    import deepspeed
    import torch
    from deepspeed.checkpoint.constants import DS_VERSION, OPTIMIZER_STATE_DICT

    common.setdefault(DS_VERSION, deepspeed.__version__)
    step = common[OPTIMIZER_STATE_DICT]["state"][0]["step"]
    model_states = torch.load(
        folder / PARTITIONED_MODEL_STATES.format(mp="00"), map_location="cpu", weights_only=False
    )
    for group in model_states["param_shapes"]:
        for name, shape in group.items():
            torch.save(step, folder / "zero" / name / STEP_FILE)
            for key in PARAMETER_STATES:
                path = folder / "zero" / name / f"{key}.pt"
                flat = torch.load(path, weights_only=False)
                torch.save({"param": flat.view(shape), "cat_dim": 0}, path)


# ZeRO stage 0 saves no partitions. Its optimizer is the torch (or DeepSpeed FusedAdam)
# optimizer itself, whose state_dict numbers the parameters in group order, or, in bf16 and
# fp16, a DeepSpeed wrapper over it keeping fp32 copies (runtime/engine.py
# `_configure_optimizer`, line 2360, `_do_optimizer_sanity_check`, line 2321): over FusedAdam
# FP16_Optimizer, one flat copy per group, the group's parameters flattened in order and
# unpadded (runtime/fp16/fused_optimizer.py, lines 89-103), over any other optimizer (torch's
# Adam on a CPU) FP16_UnfusedOptimizer, one copy per parameter
# (runtime/fp16/unfused_optimizer.py, lines 74-88; `_configure_fp16_optimizer`, engine.py,
# line 2564); the optimizer's state is over the copies. All of it is saved under "optimizer"
# in mp_rank_00_model_states.pt (runtime/engine.py `_common_checkpoint_state`, line 5020;
# fused_optimizer.py `state_dict`, line 450; unfused_optimizer.py, line 335).
# ds_to_universal reads only ZeRO's *_optim_states.pt files, so stage 0 converts here.
FLAT_COPIES = "fp32_groups_flat"  # FP16_Optimizer: fused_optimizer.py, lines 100 and 471
COPIES = "fp32_groups"  # FP16_UnfusedOptimizer: unfused_optimizer.py, lines 87 and 355
LOW_PRECISION_GROUPS = "fp16_groups"  # both: fused_optimizer.py 92, unfused_optimizer.py 74


def universal_from_stage_0(
    input_folder: Path, output_folder: Path, parameter_groups: list[list[str]]
) -> None:
    """The universal checkpoint of a ZeRO stage 0 checkpoint, in both stages' forms (above).

    `parameter_groups`: the names of the parameters in the order the optimizer held them,
    group by group, as the saving run recorded them: stage 0's files number them only. Each
    tensor rank's file holds its slices; they are joined as ds_to_universal joins ZeRO's: each
    written as the fragment `dump_param_fragment` writes, then merged by `merge_tp_slices`
    with the layout AutoTP recorded (deepspeed/checkpoint/ds_to_universal.py, lines 223 and
    298; the recorded layout: its `universal_checkpoint_info`). An fp16 run's loss scale is
    not carried: it starts again from the configured one."""
    import deepspeed
    import torch
    from deepspeed.checkpoint import ds_to_universal
    from deepspeed.checkpoint.constants import (
        DS_VERSION,
        OPTIMIZER_STATE_DICT,
        PARAM_GROUPS,
        UNIVERSAL_CHECKPOINT_INFO,
    )

    fragments = output_folder / "tmp"
    shapes: dict[str, list] = {}  # name -> its shape on each tensor rank
    files = sorted(input_folder.glob(WHOLE_MODEL_STATES.format(mp="*")))
    for tensor_rank, path in enumerate(files):
        states = torch.load(path, map_location="cpu", weights_only=False)
        saved = states.pop("optimizer")
        for name, values in _stage_0_parameter_states(states["module"], saved, parameter_groups):
            shapes.setdefault(name, []).append(states["module"][name].shape)
            for key, value in values.items():
                flat = value if key == STEP else value.reshape(-1).float()
                size = 0 if key == STEP else flat.numel()
                ds_to_universal.dump_param_fragment(
                    str(fragments), tensor_rank, 0, key, flat, name, 0, size
                )
        torch.save(states, output_folder / path.name)
        if tensor_rank == 0:
            info = states.get(UNIVERSAL_CHECKPOINT_INFO, {})
            basic = saved.get(OPTIMIZER_STATE_DICT, saved)
    for name_and_shapes in shapes.items():
        ds_to_universal.merge_tp_slices(
            info, str(output_folder / "zero"), str(fragments), len(files), name_and_shapes
        )
    shutil.rmtree(fragments)
    common = {DS_VERSION: deepspeed.__version__, PARAM_GROUPS: basic[PARAM_GROUPS]}
    _add_the_zero_3_form(common, output_folder)
    torch.save(common, output_folder / COMMON_OPTIMIZER_STATE)
    for path in files:
        mp = path.name.removesuffix("_model_states.pt").rsplit("_", 1)[1]
        os.link(output_folder / path.name, output_folder / PARTITIONED_MODEL_STATES.format(mp=mp))


def _stage_0_parameter_states(module: dict, saved: dict, parameter_groups: list[list[str]]):
    """(name, its fp32 weights, Adam moments and step) for each parameter of one tensor
    rank's stage 0 file: `module` its model state, `saved` its optimizer's (above)."""
    from deepspeed.checkpoint.constants import OPTIMIZER_STATE_DICT

    wrapped = OPTIMIZER_STATE_DICT in saved
    basic = saved[OPTIMIZER_STATE_DICT] if wrapped else saved
    numbered = 0  # the optimizer's number of the group's first parameter
    for index, names in enumerate(parameter_groups):
        if FLAT_COPIES in saved:
            state = basic["state"][index]
            sizes = [module[name].numel() for name in names]
            pieces = {
                key: flat.split(sizes)
                for key, flat in (
                    ("fp32", saved[FLAT_COPIES][index]),
                    ("exp_avg", state["exp_avg"]),
                    ("exp_avg_sq", state["exp_avg_sq"]),
                )
            }
            for i, name in enumerate(names):
                yield name, {STEP: state[STEP], **{k: v[i] for k, v in pieces.items()}}
            continue
        for i, name in enumerate(names):
            state = basic["state"][numbered + i]
            fp32 = saved[COPIES][index][i] if wrapped else module[name]
            yield name, {**state, "fp32": fp32}  # its step and moments, as saved
        numbered += len(names)


def stage_0_parameter_groups(engine) -> list[list]:
    """The parameters of a ZeRO stage 0 engine's optimizer, group by group, in its order:
    the model's own, which the bf16 and fp16 wrappers hold copies of."""
    if hasattr(engine.optimizer, LOW_PRECISION_GROUPS):
        return getattr(engine.optimizer, LOW_PRECISION_GROUPS)
    return [group["params"] for group in engine.optimizer.param_groups]


def load_universal_into_stage_0(engine, folder: Path) -> None:
    """A universal checkpoint's weights and Adam state into a ZeRO stage 0 engine, built
    without `checkpoint.load_universal`: DeepSpeed's universal loaders load into ZeRO's
    partitions only (`_hp_mapping`, `ds_id`; `safe_set_full_fp32_param` does nothing
    without them, utils/tensor_fragment.py, lines 154 and 190), and `load_checkpoint`
    then calls `update_lp_params`, which no stage 0 optimizer has (engine.py, line 4488).

    Each parameter is read by DeepSpeed's own per-parameter loader
    (checkpoint/universal_checkpoint.py `load_hp_checkpoint_state`, line 236), which cuts a
    tensor rank's slice as AutoTP split it, given a `_hp_mapping` whose one fragment is the
    rank's whole slice (`_WholeSlice`). Names are DeepSpeed's for the engine's parameters
    (`engine.param_names`, runtime/engine.py, line 628), which name the universal folders;
    the tensor rank and degree are the ones DeepSpeed's loader asks the engine's `mpu` for
    (runtime/base_optimizer.py, lines 341-347). The groups take the saved settings but their
    parameters, as that loader does (lines 377-380). Each parameter's step is the one saved,
    of the type its optimizer keeps (a tensor for torch's Adam, a number for FusedAdam), one
    per parameter: torch's Adam advances each in place."""
    import torch
    from deepspeed.checkpoint import universal_checkpoint
    from deepspeed.checkpoint.constants import PARAM_GROUPS
    from deepspeed.utils.bwc import (
        bwc_tensor_model_parallel_rank,
        bwc_tensor_model_parallel_world_size,
    )

    common = torch.load(folder / COMMON_OPTIMIZER_STATE, weights_only=False)
    wrapper = engine.optimizer
    flat_copies, copies = getattr(wrapper, FLAT_COPIES, None), getattr(wrapper, COPIES, None)
    basic = wrapper if flat_copies is None and copies is None else wrapper.optimizer
    tensor_rank = bwc_tensor_model_parallel_rank(mpu=engine.mpu)
    tensor_ranks = bwc_tensor_model_parallel_world_size(mpu=engine.mpu)

    def load(param, fp32) -> dict:
        """This rank's slice of `param`'s saved weights into `fp32`, flat; its step and
        moments, flat too."""
        param._hp_mapping = slice_ = _WholeSlice(fp32)
        try:
            step = universal_checkpoint.load_hp_checkpoint_state(
                param, str(folder / "zero" / engine.param_names[param]), tensor_rank, tensor_ranks
            )
        finally:
            del param._hp_mapping
        moments = {key: slice_.optim_fragment[key].to(fp32.device) for key in MOMENTS}
        return {STEP: step.clone() if isinstance(step, torch.Tensor) else step, **moments}

    groups = zip(
        stage_0_parameter_groups(engine), basic.param_groups, common[PARAM_GROUPS], strict=True
    )
    with torch.no_grad():
        for index, (params, group, saved_group) in enumerate(groups):
            if flat_copies is not None:
                holders = [flat_copies[index]]
                pieces = flat_copies[index].split([param.numel() for param in params])
                loaded = [load(param, piece) for param, piece in zip(params, pieces, strict=True)]
                states = [
                    {
                        STEP: loaded[0][STEP],
                        **{key: torch.cat([state[key] for state in loaded]) for key in MOMENTS},
                    }
                ]
                for param, piece in zip(params, pieces, strict=True):
                    param.copy_(piece.view(param.shape))
            else:
                holders = copies[index] if copies is not None else params
                states = []
                for param, holder in zip(params, holders, strict=True):
                    state = load(param, holder.data.view(-1))
                    state.update({key: state[key].view(holder.shape) for key in MOMENTS})
                    states.append(state)
                    param.copy_(holder)  # from the fp32 copy (without a wrapper: itself)
            for holder, state in zip(holders, states, strict=True):
                basic.state[holder] = state
            group.update({key: value for key, value in saved_group.items() if key != "params"})


class _WholeSlice:
    """What `load_hp_checkpoint_state` reads of a ZeRO parameter's `_hp_mapping`
    (universal_checkpoint.py, lines 237-238, 369, 377 and 385): the fragment's address in the
    rank's slice, the fp32 tensor it loads the weights into, and the moments it leaves in
    `optim_fragment`. Here the fragment is the whole slice."""

    def __init__(self, fp32) -> None:
        from deepspeed.utils.tensor_fragment import fragment_address

        self.fp32 = fp32
        self.lp_fragment_address = fragment_address(numel=fp32.numel(), start=0)
        self.optim_fragment: dict = {}

    def get_hp_fragment(self):
        return self.fp32


def empty_host_cache() -> None:
    """Give the pinned blocks torch's host caching allocator keeps back to the OS.

    Public since pytorch/pytorch#171270 as `torch.accelerator.empty_host_cache` (torch 2.13
    has it); torch 2.10, the cu128 image's, has only `torch._C._host_emptyCache`
    (pytorch/pytorch#134332, torch 2.5).
    """
    import torch

    public = getattr(torch.accelerator, "empty_host_cache", None)
    if public is not None:
        public()
    else:
        torch._C._host_emptyCache()


def compile_when_first_called() -> None:
    """DeepSpeed's `@compiler.compile()` kernels are handed to torch.compile when first
    called, not when their module is imported.

    DeepSpeed 0.19.8 imports its Muon optimizer on every ZeRO run, Muon or not
    (`is_zero_supported_optimizer`, deepspeed/runtime/zero/utils.py, line 72, whose comment
    says "importing Muon compiles its kernels"). That module decorates three kernels with
    `@compiler.compile()` (deepspeed/runtime/zero/muon/original_muon.py, lines 50, 81, 189),
    which returns `torch.compile` (deepspeed/runtime/compiler.py, line 125), and torch.compile
    builds its Inductor backend when it decorates: all of torch._inductor is imported, 1.1 s
    of CPU and 43 MB on every rank (measured on torch 2.13), for kernels the trainer never
    runs. DeepSpeed defers torch._disable_dynamo the same way (`compiler.lazy_disable`).
    Installed once per process, before the optimizer is built.
    """
    from deepspeed.runtime import compiler

    compiler.compile = _deferred_compile


def _deferred_compile() -> Callable[[Callable], Callable]:
    """`compiler.compile()` once installed: the decorator below instead of torch.compile."""
    return _compile_when_first_called


def _compile_when_first_called(function: Callable) -> Callable:
    import torch

    compiled = None

    @functools.wraps(function)
    def call(*args, **kwargs):
        nonlocal compiled
        if compiled is None:
            compiled = torch.compile(function)
        return compiled(*args, **kwargs)

    return call
