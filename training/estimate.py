"""`python -m training estimate`: GPU memory per rank for a config on a target GPU, before renting.

Model states (parameters, gradients, optimizer states) come from DeepSpeed's own
estimators, the functions its `estimate_zero{2,3}_model_states_mem_needs_all_live`
print from (deepspeed/runtime/zero/stage_1_and_2.py, stage3.py). DeepSpeed has no
estimator for ZeRO-0 and -1: ZeRO-0 partitions nothing, so it is the ZeRO-2 figure
of a single rank; ZeRO-1 is shown at the ZeRO-2 figure, a lower bound (it keeps
whole gradients). The model is built on PyTorch's meta device: shapes only,
no memory, so a 1.3B model is counted in a second on a laptop.

Activations of the built-in GPT presets follow Korthikanti et al. 2022 ("Reducing
Activation Recomputation in Large Transformer Models", section 4.1): 34·s·b·h bytes
per layer in 16-bit, without the 5·a·s²·b attention-score term because
scaled_dot_product_attention's fused kernels keep no s×s matrix; with activation
checkpointing each layer keeps only its input (2·s·b·h) and one layer is
recomputed at a time. The output layer adds its logits (16-bit, the fp32 copy the
loss takes, and its fp32 gradient).

Activations of the ResNet presets are counted, not modelled: one forward on the meta
device in the run's precision, with autograd's saved-tensor hook
(torch.autograd.graph.saved_tensors_hooks) adding up each storage kept for the backward
once, parameters excluded. tests/training/test_estimate.py checks the count against
the activation memory measured on a CPU forward.

A Hugging Face model (model.hf) is estimated from its config.json alone: no weights are
downloaded. Its parameters are counted on the meta device, its activations counted as
the ResNets' are, through the loss, with attention replaced by a stand-in that keeps
what a fused attention kernel (FlashAttention, SDPA's efficient kernels) keeps for the
backward: q, k, v, the output and one float per query and head, never the s×s scores.
With activation checkpointing each layer keeps its input and one layer is recomputed at
a time: one layer's count comes from the difference of a 1-layer and the full model.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

import torch

from training.components import build_model
from training.environment import TrainerEnv
from training.spec.config import Config, ConfigError, add_overrides_argument, load_config, validate
from training.spec.parallel import check_model_layout, kv_heads, split_source, tensor_degree
from training.spec.presets import PRESETS, VISION_PRESETS
from training.spec.selfcheck import SelfCheckError, check_precision

GIB = 2**30
# Kept free of the GPU's memory: the CUDA context, NCCL buffers and allocator fragmentation.
RESERVE_FRACTION = 0.10

# GPU types by `--gpu-type` name: memory in GiB and compute capability (NVIDIA datasheets;
# the "16GB" of a V100 is 16 GiB of HBM2).
GPU_TYPES: dict[str, tuple[float, tuple[int, int]]] = {
    "V100-16GB": (16, (7, 0)),
    "V100-32GB": (32, (7, 0)),
    "T4-16GB": (16, (7, 5)),
    "A10G-24GB": (24, (8, 6)),
    "L4-24GB": (24, (8, 9)),
    "L40S-48GB": (48, (8, 9)),
    "A100-40GB": (40, (8, 0)),
    "A100-80GB": (80, (8, 0)),
    "H100-80GB": (80, (9, 0)),
    "H200-141GB": (141, (9, 0)),
}
# GPU types whose multi-GPU AWS instances join their GPUs with NVLink (p3.16xlarge,
# p4d/p4de with NVSwitch, p5/p5e): a tensor group's all-reduces stay fast inside the node.
# The others (g4dn, g5, g6, g6e) join them over PCIe (https://aws.amazon.com/ec2/instance-types/).
NVLINK_GPU_TYPES = frozenset(
    ("V100-16GB", "V100-32GB", "A100-40GB", "A100-80GB", "H100-80GB", "H200-141GB")
)


@dataclass(frozen=True)
class Setup:
    """One way to run the job: a ZeRO stage and what it offloads to CPU memory."""

    stage: int
    offload_optimizer: bool = False
    offload_param: bool = False

    @property
    def label(self) -> str:
        offload = [
            name
            for name, on in (("optimizer", self.offload_optimizer), ("params", self.offload_param))
            if on
        ]
        return f"ZeRO-{self.stage}" + (f" + offload {' + '.join(offload)}" if offload else "")

    def settings(self) -> list[str]:
        return [
            f"zero.stage={self.stage}",
            f"zero.offload_optimizer={str(self.offload_optimizer).lower()}",
            f"zero.offload_param={str(self.offload_param).lower()}",
        ]


# The setups DeepSpeed's estimators cover, cheapest in speed first: offloading moves
# optimizer steps (and parameters) over PCIe.
SETUPS = (
    Setup(2),
    Setup(3),
    Setup(2, offload_optimizer=True),
    Setup(3, offload_optimizer=True),
    Setup(3, offload_optimizer=True, offload_param=True),
)


@dataclass(frozen=True)
class ModelSize:
    total_params: int  # shared (tied) parameters once, as DeepSpeed counts them
    largest_layer_params: int  # the biggest module's own parameters (ZeRO-3 gathers one)
    # The decoder layers' linear weights, which tensor parallelism splits (a model's
    # tp_plan names these); embeddings, norms and the output layer stay whole on each rank.
    split_params: int = 0

    def per_rank(self, tensor: int) -> ModelSize:
        """What one rank of a `tensor`-way group holds."""
        if tensor == 1:
            return self
        kept = self.total_params - self.split_params + self.split_params // tensor
        return ModelSize(kept, self.largest_layer_params, self.split_params // tensor)


@dataclass(frozen=True)
class Row:
    setup: Setup
    states_bytes: int  # per GPU
    cpu_bytes: int  # per node
    activation_bytes: int | None  # per GPU, None for a model the formula does not know
    checkpointed_bytes: int | None


def model_size(config: Config) -> ModelSize:
    """Parameter counts of the config's model, built on the meta device (no memory)."""
    with torch.device("meta"):
        model = _hf_model(config) if config.is_hf else build_model(config)
    total = sum({id(p): p.numel() for p in model.parameters()}.values())
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    split = {
        id(p): p.numel()
        for stack in model.modules()
        if isinstance(stack, torch.nn.ModuleList)
        for layer in stack.modules()
        if isinstance(layer, torch.nn.Linear)
        for p in layer.parameters(recurse=False)
    }
    # A transformers model class's own plan splits its output layer too (Llama's
    # _tp_plan = {"lm_head": "colwise_gather_output"}).
    hf_model = getattr(model, "model", model)
    for name in getattr(type(hf_model), "_tp_plan", None) or {}:
        module = getattr(hf_model, name, None)
        if isinstance(module, torch.nn.Linear):
            split |= {id(p): p.numel() for p in module.parameters(recurse=False)}
    return ModelSize(total, largest, sum(split.values()))


def tensor_activation_share(tensor: int) -> float:
    """The share of a layer's activations one rank of a `tensor`-way group keeps:
    s·b·h·(10 + 24/t) of 34·s·b·h (Korthikanti et al. 2022, section 4.2.1, tensor
    parallelism without sequence parallelism: layer norms, dropouts and the layer inputs
    stay whole on every rank)."""
    return (10 + 24 / tensor) / 34


def model_states(size: ModelSize, setup: Setup, *, gpus_per_node: int, nodes: int):
    """(GPU bytes per rank, CPU bytes per node) for the parameters, gradients and optimizer."""
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    params = size.total_params
    if setup.stage < 3:
        unpartitioned = setup.stage == 0
        cpu, gpu = estimate_zero2_model_states_mem_needs(
            total_params=params,
            num_gpus_per_node=1 if unpartitioned else gpus_per_node,
            num_nodes=1 if unpartitioned else nodes,
            cpu_offload=setup.offload_optimizer,
        )
        return gpu, cpu
    cpu, gpu, _ = estimate_zero3_model_states_mem_needs(
        total_params=params,
        largest_layer_params=size.largest_layer_params,
        num_gpus_per_node=gpus_per_node,
        num_nodes=nodes,
        cpu_offload=setup.offload_optimizer,
        cpu_offload_params=setup.offload_param,
    )
    return gpu, cpu


def _dtype(config: Config) -> torch.dtype:
    precision = config.precision
    return torch.bfloat16 if precision.bf16 else torch.float16 if precision.fp16 else torch.float32


def _is_vision(config: Config) -> bool:
    return config.model.builder is None and config.model.preset in VISION_PRESETS


def saved_activation_bytes(model: torch.nn.Module, *inputs: torch.Tensor):
    """Bytes autograd keeps from one forward (of the loss) for the backward: each storage
    once, without the parameters (counted with the model states)."""
    # A storage's _cdata is its address: views and in-place results of one buffer share it.
    params = {p.untyped_storage()._cdata for p in model.parameters()}
    kept: dict[int, int] = {}

    def keep(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage._cdata not in params:
            kept[storage._cdata] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(keep, lambda tensor: tensor):
        model(*inputs)
    return sum(kept.values())


def _hf_config(config: Config, layers: int | None = None):
    """model.hf's configuration from its config.json alone; `layers`: that many layers."""
    from transformers import AutoConfig

    from training.hf.source import config_file
    from training.logs import adopt_hf_loggers

    adopt_hf_loggers()
    hf_config = AutoConfig.from_pretrained(
        config_file(config), trust_remote_code=config.model.trust_remote_code
    )
    if config.model.num_labels is not None:
        hf_config.num_labels = config.model.num_labels
    if layers is not None:
        hf_config.get_text_config().num_hidden_layers = layers
    return hf_config


def _hf_model(config: Config, layers: int | None = None, attention: str = "sdpa"):
    from training.hf.model import architecture

    return architecture(config, _hf_config(config, layers), attention=attention)


class _FusedAttentionSaves(torch.autograd.Function):
    """Attention's output, keeping for the backward what a fused kernel keeps."""

    @staticmethod
    def forward(ctx, query, key, value):
        batch, heads, length, width = query.shape
        out = query.new_empty(batch, length, heads, width)
        log_sum_exp = query.new_empty(batch, heads, length, dtype=torch.float32)
        ctx.save_for_backward(query, key, value, out, log_sum_exp)
        return out

    @staticmethod
    def backward(ctx, grad):  # counting only: never run
        raise NotImplementedError


def _counted_attention(module, query, key, value, attention_mask, **kwargs):
    """An attention function for transformers' AttentionInterface (q, k, v of shape
    batch x heads x length x width; output batch x length x heads x width)."""
    return _FusedAttentionSaves.apply(query, key, value), None


_COUNTED_ATTENTION = "estimate_fused"


def _hf_activations(config: Config, micro_batch: int) -> tuple[int, int]:
    """(activation bytes, with activation checkpointing) of a model.hf model."""
    from transformers import AttentionInterface

    AttentionInterface.register(_COUNTED_ATTENTION, _counted_attention)
    length = config.data.seq_len
    classifier = config.model.task == "sequence-classification"

    def count(layers: int | None) -> int:
        with torch.device("meta"):
            model = _hf_model(config, layers, attention=_COUNTED_ATTENTION)
            inputs = torch.zeros(micro_batch, length, dtype=torch.long)
            targets = torch.zeros(micro_batch, dtype=torch.long) if classifier else inputs
        return saved_activation_bytes(model, inputs, targets)

    text = _hf_config(config).get_text_config()
    layers, plain = text.num_hidden_layers, count(None)
    if layers < 2:
        return plain, plain
    per_layer = (plain - count(1)) // (layers - 1)
    element = 4 if _dtype(config) == torch.float32 else 2
    layer_inputs = layers * micro_batch * length * text.hidden_size * element
    return plain, plain - layers * per_layer + layer_inputs + per_layer


def _vision_activations(config: Config, micro_batch: int) -> int:
    size = config.data.image_size
    with torch.device("meta"):
        model = build_model(config).to(_dtype(config))
        images = torch.empty(micro_batch, 3, size, size)
        labels = torch.zeros(micro_batch, dtype=torch.long)
    return saved_activation_bytes(model, images, labels)


def activations(config: Config, micro_batch: int, *, checkpointing: bool) -> int | None:
    """Activation bytes per rank for one micro batch of a built-in preset (None: unknown,
    a model.builder model's, or a ResNet's with checkpointing, which they do not support)."""
    if config.model.builder is not None:
        return None
    if config.is_hf:
        plain, checkpointed = _hf_activations(config, micro_batch)
        return checkpointed if checkpointing else plain
    if _is_vision(config):
        return None if checkpointing else _vision_activations(config, micro_batch)
    shape = PRESETS[config.model.preset] | {
        key: value
        for key in ("n_layer", "n_embd")
        if (value := getattr(config.model, key)) is not None
    }
    layers, width = shape["n_layer"], shape["n_embd"]
    element = 2 if (config.precision.bf16 or config.precision.fp16) else 4
    tokens = micro_batch * config.data.seq_len
    per_layer = 34 * tokens * width * element // 2
    # Checkpointed: every layer keeps its input, one layer's activations are rebuilt at a time.
    kept = layers * tokens * width * element + per_layer if checkpointing else layers * per_layer
    logits = tokens * config.vocab_size * (element + 4 + 4)
    return kept + logits


def _data_unread(config: Config) -> Config:
    """The estimate reads no data: a job whose data path is set only where it runs (a
    stack's TRAIN_DATA_PATH) is estimated all the same."""
    unread = config.data.model_copy(update={"path": config.data.path or "not-read-by-estimate"})
    return config.model_copy(update={"data": unread})


def estimate(
    config: Config, *, gpus: int, nodes: int = 1, counted: dict | None = None
) -> tuple[ModelSize, int, list[Row]]:
    """(model size, micro batch, one row per ZeRO setup) for `gpus` ranks over `nodes`.
    ``counted``: activation counts by micro batch, kept between calls for one model."""
    _check_target(gpus, nodes)
    micro = validate(_data_unread(config), gpus, gpus // nodes).micro_batch_size
    tensor = tensor_degree(config)
    size = model_size(config)
    zero = config.zero
    current = Setup(zero.stage, zero.offload_optimizer, zero.offload_param)
    rows = []
    # Activations do not depend on the ZeRO setup: counted once.
    share = tensor_activation_share(tensor) / config.parallel.sequence
    counted = {} if counted is None else counted
    if micro not in counted:
        counted[micro] = [activations(config, micro, checkpointing=on) for on in (False, True)]
    plain, saved = (None if count is None else int(count * share) for count in counted[micro])
    # The ZeRO partitions span the data-parallel ranks of each tensor slice.
    for setup in (() if current in SETUPS else (current,)) + SETUPS:
        states, cpu = model_states(
            size.per_rank(tensor), setup, gpus_per_node=gpus // nodes // tensor, nodes=nodes
        )
        rows.append(Row(setup, states, cpu * tensor, plain, saved))
    return size, micro, rows


@dataclass(frozen=True)
class LayoutRow:
    tensor: int
    micro_batch: int
    bytes_per_rank: int | None  # the config's ZeRO setup and checkpointing; None: unknown
    divides_heads: bool


@dataclass(frozen=True)
class LayoutChoice:
    tensor: int
    reason: str  # one line: why this tensor degree
    rows: list[LayoutRow]


def _with_tensor(config: Config, tensor: int) -> Config:
    return config.model_copy(
        update={"parallel": config.parallel.model_copy(update={"tensor": tensor})}
    )


def _check_target(gpus: int, nodes: int) -> None:
    if gpus < 1:
        raise ConfigError(f"--gpus {gpus}: a job needs at least 1 GPU")
    if nodes < 1:
        raise ConfigError(f"--nodes {nodes}: a job needs at least 1 node")
    if gpus % nodes:
        raise ConfigError(f"--gpus {gpus} over --nodes {nodes}: give a GPU count nodes divide")


def layout_rows(
    config: Config, *, gpus: int, nodes: int, counted: dict | None = None
) -> list[LayoutRow]:
    """Memory per rank of each tensor degree the job could take (1, 2, 4, 8 within a node,
    dividing the world): the config's ZeRO setup and activation checkpointing."""
    per_node = gpus // nodes
    heads, splits = None, False
    if config.is_hf:
        hf_config = _hf_config(config)
        heads, splits = kv_heads(hf_config), split_source(config, hf_config) is not None
    candidates = [1, 2, 4, 8] if splits and config.parallel.sequence == 1 else [1]
    rows, counted = [], {} if counted is None else counted
    for tensor in candidates:
        if tensor > per_node or gpus % tensor:
            continue
        candidate = _with_tensor(config, tensor)
        try:
            _, micro, estimated = estimate(candidate, gpus=gpus, nodes=nodes, counted=counted)
        except ConfigError:  # the global batch does not split over its data-parallel ranks
            continue
        zero = config.zero
        mine = next(
            row
            for row in estimated
            if row.setup == Setup(zero.stage, zero.offload_optimizer, zero.offload_param)
        )
        total = _total(mine, config.model.activation_checkpointing)
        rows.append(LayoutRow(tensor, micro, total, heads is None or heads % tensor == 0))
    return rows


def choose_tensor(
    config: Config,
    *,
    gpus: int,
    nodes: int,
    usable_bytes: float,
    nvlink: bool,
    where: str,
    counted: dict | None = None,
) -> LayoutChoice:
    """parallel.tensor = "auto": the fewest ranks per layer whose memory per rank fits.

    Splitting layers costs two all-reduces per layer and pass inside the tensor group, so
    a model that fits with data parallelism (and its ZeRO stage) alone stays unsplit. Past
    that the smallest degree that fits wins; one that leaves ranks without key/value heads
    only when no other fits. Over PCIe (no NVLink) the all-reduces are slow, which the
    reason says. Long sequences count through their activations, which a tensor group
    splits (tensor_activation_share). ``where``: the GPU type, for the reason."""
    rows = layout_rows(config, gpus=gpus, nodes=nodes, counted=counted)
    first = rows[0]
    if first.bytes_per_rank is None:
        return LayoutChoice(1, "the model's activations are not estimated: tensor 1", rows)
    at_one = f"{_gib(first.bytes_per_rank)} GiB per GPU at tensor 1"
    budget = f"{usable_bytes / GIB:.1f} GiB usable on {where}"
    if first.bytes_per_rank <= usable_bytes:
        return LayoutChoice(
            1,
            f"{at_one} fits the {budget}: data parallelism with ZeRO-{config.zero.stage} alone "
            "keeps the all-reduces out of every layer",
            rows,
        )
    fitting = [row for row in rows if row.bytes_per_rank <= usable_bytes]
    fitting.sort(key=lambda row: (not row.divides_heads, row.tensor))
    link = "inside the node over NVLink" if nvlink else "over PCIe (no NVLink: slow all-reduces)"
    seq = f"seq_len {config.data.seq_len}"
    if fitting:
        row = fitting[0]
        return LayoutChoice(
            row.tensor,
            f"{at_one} is over the {budget}; tensor {row.tensor} needs "
            f"{_gib(row.bytes_per_rank)} GiB ({seq}), its layers split {link}",
            rows,
        )
    row = min(rows, key=lambda row: row.bytes_per_rank)
    return LayoutChoice(
        row.tensor,
        f"no layout fits the {budget} ({seq}); tensor {row.tensor} needs the least, "
        f"{_gib(row.bytes_per_rank)} GiB: lower train.micro_batch_size or data.seq_len, set "
        "model.activation_checkpointing = true, or use more memory (--gpu-type)",
        rows,
    )


def tensor_at_start(config: Config, *, world_size: int, nodes: int) -> tuple[int, str]:
    """parallel.tensor = "auto" on this node's GPUs: (tensor degree, the one line saying why),
    as `estimate` would choose it for the same GPUs."""
    if not torch.cuda.is_available():
        return 1, 'parallel.tensor = "auto": tensor 1 (no GPU: nothing to split layers over)'
    properties = torch.cuda.get_device_properties(0)
    choice = choose_tensor(
        config,
        gpus=world_size,
        nodes=nodes,
        usable_bytes=properties.total_memory * (1 - RESERVE_FRACTION),
        nvlink=_has_nvlink(),
        where=properties.name,
    )
    return choice.tensor, f'parallel.tensor = "auto": tensor {choice.tensor}: {choice.reason}'


def _has_nvlink() -> bool:
    """Whether GPU 0 has an active NVLink (NVML; PCIe-only GPUs report NotSupported)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        return pynvml.nvmlDeviceGetNvLinkState(handle, 0) == pynvml.NVML_FEATURE_ENABLED
    except Exception:  # no NVML, or no NVLink on this GPU
        return False


def _layout_table(rows: list[LayoutRow], chosen: int, gpus: int, usable: float) -> str:
    lines = ["LAYOUT                      MICRO  TOTAL GiB"]
    for row in rows:
        name = f"tensor {row.tensor} x data {gpus // row.tensor}"
        mark = _fit_mark(row.bytes_per_rank, usable)
        notes = [] if row.divides_heads else ["idle ranks: does not divide the KV heads"]
        if row.tensor == chosen:
            notes.insert(0, "<- chosen")
        lines.append(
            f"{name:<26}  {row.micro_batch:>5}  {_gib(row.bytes_per_rank):>8}{mark}"
            + (f"  {'; '.join(notes)}" if notes else "")
        )
    return "\n".join(lines)


def _gib(value: int | None) -> str:
    return "?" if value is None else f"{value / GIB:.2f}"


def _count(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M" if n >= 1e5 else f"{n:,}"


def _sample(config: Config) -> str:
    if _is_vision(config):
        return f"{config.data.image_size}x{config.data.image_size} images"
    return f"{config.data.seq_len} tokens"


def report(config: Config, *, gpus: int, nodes: int, gpu_type: str) -> str:
    memory_gib, capability = GPU_TYPES[gpu_type]
    usable = memory_gib * (1 - RESERVE_FRACTION) * GIB
    _check_target(gpus, nodes)
    validate(_data_unread(config), gpus, gpus // nodes)  # the layout's own checks first
    warnings = check_model_layout(config, _hf_config(config)) if config.is_hf else []
    layout_lines, counted = [], {}
    if config.is_hf:
        if config.parallel.tensor == "auto":
            choice = choose_tensor(
                config,
                gpus=gpus,
                nodes=nodes,
                usable_bytes=usable,
                nvlink=gpu_type in NVLINK_GPU_TYPES and gpus // nodes > 1,
                where=gpu_type,
                counted=counted,
            )
            config = _with_tensor(config, choice.tensor)
            why, rows = f'parallel.tensor = "auto": {choice.reason}', choice.rows
        else:
            why = "as configured"
            rows = layout_rows(config, gpus=gpus, nodes=nodes, counted=counted)
        tensor, sequence = tensor_degree(config), config.parallel.sequence
        data = gpus // (tensor * sequence)
        layout_lines = [
            f"layout       tensor {tensor} x sequence {sequence} x data {data}: {why}",
            *warnings,
            "",
            _layout_table(rows, tensor, gpus, usable),
            "",
        ]
    size, micro, rows = estimate(config, gpus=gpus, nodes=nodes, counted=counted)
    model = config.model.hf or config.model.builder or config.model.preset
    lines = [
        f"model        {model}: {_count(size.total_params)} parameters "
        f"(largest layer {_count(size.largest_layer_params)})",
        f"batch        micro batch {micro} x {_sample(config)} per GPU, "
        f"{'bf16' if config.precision.bf16 else 'fp16' if config.precision.fp16 else 'fp32'}",
        f"target       {gpus} x {gpu_type} ({nodes} node(s)): {memory_gib:g} GiB per GPU, "
        f"{usable / GIB:.1f} GiB usable ({RESERVE_FRACTION:.0%} kept for CUDA, NCCL, "
        "fragmentation)",
        "",
        *layout_lines,
        _table(rows, usable),
        "",
    ]
    try:
        check_precision(
            bf16=config.precision.bf16,
            fp16=config.precision.fp16,
            on_gpu=True,
            capability=capability,
        )
    except SelfCheckError as exc:
        lines.append(f"precision    {exc}")
    lines += [f"{label:<13}{text}" for label, text in _verdict(config, rows, usable)]
    return "\n".join(lines)


def fit(config: Config, *, gpus: int, nodes: int, memory_gib: float) -> tuple[bool, str, str]:
    """(whether it fits, what the config's own setup needs per GPU, the cheapest change that
    fits or "") on `gpus` GPUs of `memory_gib` GiB over `nodes`: `python -m infra plan`'s
    line for a stack's job."""
    usable = memory_gib * (1 - RESERVE_FRACTION) * GIB
    _, _, rows = estimate(config, gpus=gpus, nodes=nodes)
    (_, needs), *change = _verdict(config, rows, usable)
    return not change, needs, change[0][1] if change else ""


def _total(row: Row, checkpointing: bool) -> int | None:
    act = row.checkpointed_bytes if checkpointing else row.activation_bytes
    return None if act is None else row.states_bytes + act


def _table(rows: list[Row], usable: float) -> str:
    headers = ("SETUP", "STATES GiB", "ACT GiB", "TOTAL GiB", "ACT CKPT", "TOTAL CKPT", "CPU/NODE")
    cells = []
    for row in rows:
        plain, saved = _total(row, False), _total(row, True)
        cells.append(
            (
                row.setup.label,
                _gib(row.states_bytes),
                _gib(row.activation_bytes),
                _gib(plain) + _fit_mark(plain, usable),
                _gib(row.checkpointed_bytes),
                _gib(saved) + _fit_mark(saved, usable),
                _gib(row.cpu_bytes),
            )
        )
    widths = [max(len(str(c[i])) for c in [headers, *cells]) for i in range(len(headers))]
    out = []
    for line in [headers, *cells]:
        first, *rest = line
        numbers = [cell.rjust(width) for cell, width in zip(rest, widths[1:], strict=True)]
        out.append("  ".join([first.ljust(widths[0]), *numbers]))
    return "\n".join(out) + "\n(* fits; GiB per GPU except CPU/NODE, the host memory offload needs)"


def _fit_mark(total: int | None, usable: float) -> str:
    return "*" if total is not None and total <= usable else " "


def _verdict(config: Config, rows: list[Row], usable: float) -> list[tuple[str, str]]:
    """(label, text) lines: what the config's own setup needs, then a change when it does
    not fit."""
    zero, ckpt = config.zero, config.model.activation_checkpointing
    current = Setup(zero.stage, zero.offload_optimizer, zero.offload_param)
    mine = next(row for row in rows if row.setup == current)
    total = _total(mine, ckpt)
    what = f"{current.label}{', activation checkpointing' if ckpt else ''}"
    if total is None:
        return [
            (
                "your config",
                f"{what}: model states {_gib(mine.states_bytes)} GiB per GPU; "
                "activations of a model.builder model are not estimated: leave room for them",
            )
        ]
    if total <= usable:
        return [("your config", f"{what}: {_gib(total)} GiB per GPU: fits")]
    verdict = [("your config", f"{what}: {_gib(total)} GiB per GPU: does not fit")]
    # The cheapest change first (checkpointing, then more partitioning, then offload), and
    # never less partitioning or offload than the config already has.
    candidates = [
        row
        for row in rows
        if row.setup.stage >= current.stage
        and row.setup.offload_optimizer >= current.offload_optimizer
        and row.setup.offload_param >= current.offload_param
    ]
    for row in candidates:
        for checkpointing in (False, True):
            candidate = _total(row, checkpointing)
            if candidate is not None and candidate <= usable:
                settings = [s for s in row.setup.settings() if s not in current.settings()]
                if checkpointing and not ckpt:
                    settings.append("model.activation_checkpointing=true")
                sets = " ".join(f"--set {s}" for s in settings)
                return [
                    *verdict,
                    (
                        "change",
                        f"{row.setup.label}"
                        f"{' with activation checkpointing' if checkpointing else ''} "
                        f"fits ({_gib(candidate)} GiB): {sets}",
                    ),
                ]
    return [
        *verdict,
        (
            "change",
            "nothing here fits: lower train.micro_batch_size, use more GPUs or GPUs with "
            "more memory",
        ),
    ]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m training estimate",
        description="GPU memory per rank for a config on a target GPU count and type.",
    )
    p.add_argument("--config", help="TOML config file (default: TRAIN_CONFIG, else the demo job)")
    add_overrides_argument(p)
    p.add_argument("--gpus", type=int, default=1, help="GPUs in the job, all nodes (default 1)")
    p.add_argument("--nodes", type=int, default=1, help="nodes the GPUs sit on (default 1)")
    p.add_argument(
        "--gpu-type",
        default="A100-40GB",
        help=f"one of {', '.join(GPU_TYPES)} (default A100-40GB)",
    )
    return p


def main(argv: list[str], env: TrainerEnv) -> int:
    args = parser().parse_args(argv)
    try:
        if args.gpu_type not in GPU_TYPES:
            raise ConfigError(
                f"--gpu-type {args.gpu_type!r} is not known: use one of {', '.join(GPU_TYPES)}"
            )
        config = load_config(args.config or env.config, args.overrides, env.config_paths)
        print(report(config, gpus=args.gpus, nodes=args.nodes, gpu_type=args.gpu_type))
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0
