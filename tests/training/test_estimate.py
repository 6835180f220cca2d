"""`python -m training estimate` against DeepSpeed's own estimators, called here."""

import contextlib
import io
import re
from pathlib import Path

import pytest
import torch
from deepspeed.runtime.zero.stage3 import (
    estimate_zero3_model_states_mem_needs,
    estimate_zero3_model_states_mem_needs_all_live,
)
from deepspeed.runtime.zero.stage_1_and_2 import (
    estimate_zero2_model_states_mem_needs,
    estimate_zero2_model_states_mem_needs_all_live,
)

from tests.support.preloaded import run_module
from training.components import build_model
from training.environment import TrainerEnv
from training.estimate import (
    GPU_TYPES,
    RESERVE_FRACTION,
    Setup,
    activations,
    estimate,
    main,
    model_size,
    report,
)
from training.oom import remedies
from training.spec.config import load_config, validate
from training.spec.presets import PRESETS

REPO = Path(__file__).resolve().parents[2]
GIB = 2**30
SMALL = [
    "model.n_layer=4",
    "model.n_head=4",
    "model.n_embd=256",
    "data.vocab_size=1000",
    "data.seq_len=128",
    "train.micro_batch_size=2",
]
# "  per CPU  |  per GPU |   Options" rows of DeepSpeed's printed estimate.
_ROW = re.compile(r"^\s*([\d.]+)GB \|\s*([\d.]+)GB \| (.*)$")


def _deepspeed_table(function, model, gpus: int) -> dict[str, tuple[float, float]]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        function(model, num_gpus_per_node=gpus, num_nodes=1)
    rows = {}
    for line in out.getvalue().splitlines():
        if match := _ROW.match(line):
            rows[match[3].replace("OffloadDeviceEnum.", "")] = (float(match[1]), float(match[2]))
    return rows


@pytest.mark.parametrize("gpus", [1, 4])
def test_model_states_match_deepspeeds_live_estimators(gpus):
    config = load_config(None, SMALL)
    model = build_model(config)  # a real model: DeepSpeed counts its parameters itself
    zero2 = _deepspeed_table(estimate_zero2_model_states_mem_needs_all_live, model, gpus)
    zero3 = _deepspeed_table(estimate_zero3_model_states_mem_needs_all_live, model, gpus)
    _, _, rows = estimate(config, gpus=gpus)
    mine = {row.setup: (row.cpu_bytes / GIB, row.states_bytes / GIB) for row in rows}
    expected = {
        Setup(2): zero2["offload_optimizer=none"],
        Setup(2, offload_optimizer=True): zero2["offload_optimizer=cpu"],
        Setup(3): zero3["offload_param=none, offload_optimizer=none, zero_init=1"],
        Setup(3, offload_optimizer=True): zero3[
            "offload_param=none, offload_optimizer=cpu, zero_init=1"
        ],
        Setup(3, offload_optimizer=True, offload_param=True): zero3[
            "offload_param=cpu, offload_optimizer=cpu, zero_init=1"
        ],
    }
    for setup, (cpu, gpu) in expected.items():
        assert mine[setup] == (pytest.approx(cpu, abs=0.006), pytest.approx(gpu, abs=0.006))


def test_meta_device_count_is_the_real_models():
    config = load_config(None, SMALL)
    model = build_model(config)
    tied_once = sum({p.data_ptr(): p.numel() for p in model.parameters()}.values())
    assert model_size(config).total_params == tied_once


def _gpt_params(n_layer: int, n_embd: int, vocab: int, seq_len: int) -> int:
    """GPT-2 layout: tied token table, positions, per block 12h² + 13h, final LayerNorm."""
    return vocab * n_embd + seq_len * n_embd + n_layer * (12 * n_embd**2 + 13 * n_embd) + 2 * n_embd


def test_gpt_1_3b_on_one_v100_needs_the_optimizer_offloaded():
    overrides = [
        "model.preset=gpt-1.3b",
        "data.seq_len=1024",
        "data.vocab_size=50304",
        "train.micro_batch_size=1",
        "precision.fp16=true",
        "zero.stage=2",
    ]
    config = load_config(None, overrides)
    shape = PRESETS["gpt-1.3b"]
    params = _gpt_params(shape["n_layer"], shape["n_embd"], 50304, 1024)
    assert model_size(config).total_params == params
    usable = GPU_TYPES["V100-16GB"][0] * (1 - RESERVE_FRACTION) * GIB
    _, zero2_gpu = estimate_zero2_model_states_mem_needs(params, 1, 1, cpu_offload=False)
    _, offload_gpu = estimate_zero2_model_states_mem_needs(params, 1, 1, cpu_offload=True)
    assert zero2_gpu > usable > offload_gpu  # DeepSpeed's own figures decide the answer

    text = report(config, gpus=1, nodes=1, gpu_type="V100-16GB")
    assert f"{zero2_gpu / GIB:.2f}" in text and f"{offload_gpu / GIB:.2f}" in text
    verdict = next(line for line in text.splitlines() if line.startswith("your config"))
    assert "ZeRO-2" in verdict and "does not fit" in verdict
    change = next(line for line in text.splitlines() if line.startswith("change"))
    assert "--set zero.offload_optimizer=true" in change and "zero.stage" not in change


def test_eight_a100s_fit_gpt_1_3b_at_zero_2():
    config = load_config(None, ["model.preset=gpt-1.3b", "precision.bf16=true"])
    text = report(config, gpus=8, nodes=1, gpu_type="A100-40GB")
    assert "ZeRO-2: " in text and ": fits" in text and "change" not in text


def test_bf16_on_a_v100_is_named():
    config = load_config(None, ["precision.bf16=true"])
    assert "needs compute capability 8.0" in report(config, gpus=1, nodes=1, gpu_type="V100-16GB")


def test_activation_checkpointing_keeps_less():
    config = load_config(None, ["model.preset=gpt-350m", "data.seq_len=1024"])
    _, _, rows = estimate(config, gpus=1)
    assert all(row.checkpointed_bytes < row.activation_bytes for row in rows)


def test_unknown_gpu_type_exits_2_in_one_line():
    result = run_module("training", ["estimate", "--gpu-type", "A100-20GB"])
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: --gpu-type")


@pytest.mark.parametrize(
    ("overrides", "gpus", "gpu_type"),
    [
        (["model.preset=gpt-1.3b", "precision.fp16=true", "zero.stage=2"], 1, "V100-16GB"),
        (["model.preset=gpt-1.3b", "precision.bf16=true", "zero.stage=1"], 1, "A10G-24GB"),
        (["model.preset=gpt-6.7b", "precision.bf16=true", "zero.stage=2"], 8, "A100-40GB"),
        (
            ["model.preset=gpt-350m", "precision.fp16=true", "train.micro_batch_size=64"],
            1,
            "T4-16GB",
        ),
    ],
)
def test_the_estimates_change_is_advice_the_out_of_memory_sentence_gives(overrides, gpus, gpu_type):
    """A job the estimate says does not fit is one that would end in a CUDA OOM: the
    settings the estimate says would make it fit are among the OOM sentence's remedies
    (training/oom.py), so the two never send a user different ways."""
    config = load_config(None, ["data.seq_len=1024", "data.vocab_size=50304", *overrides])
    text = report(config, gpus=gpus, nodes=1, gpu_type=gpu_type)
    verdict = next(line for line in text.splitlines() if line.startswith("your config"))
    assert "does not fit" in verdict, text
    advice = remedies(config, validate(config, gpus))
    assert advice, "the OOM sentence must name something to change"
    change = next(line for line in text.splitlines() if line.startswith("change"))
    settings = re.findall(r"--set (\S+)=(\S+)", change)
    if not settings:  # nothing fits: the estimate says lower the micro batch, as the OOM does
        assert "lower train.micro_batch_size" in change
        assert any("train.micro_batch_size" in remedy for remedy in advice)
    for key, value in settings:
        named = [remedy for remedy in advice if key in remedy]
        assert named, f"the estimate sets {key}={value}; the OOM sentence names {advice}"
        if key == "zero.stage":
            assert value in named[0]


# config.json of the Hub models the shipped jobs and tests name, as their model pages give
# them (https://huggingface.co/<id>/blob/main/config.json): estimate reads nothing else.
HUB_CONFIGS = Path(__file__).with_name("data") / "hub"


@pytest.fixture
def offline_hub(tmp_path, monkeypatch):
    """huggingface_hub offline, its cache holding those config.json files only, laid out as
    hf_hub_download leaves them (models--<org>--<name>/refs/main naming a snapshot)."""
    import huggingface_hub.constants

    commit = "0" * 40
    for config in HUB_CONFIGS.glob("*/*/config.json"):
        org, name = config.parent.parent.name, config.parent.name
        repo = tmp_path / "hub" / f"models--{org}--{name}"
        (repo / "refs").mkdir(parents=True)
        (repo / "refs" / "main").write_text(commit)
        (repo / "snapshots" / commit).mkdir(parents=True)
        (repo / "snapshots" / commit / "config.json").write_bytes(config.read_bytes())
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


@pytest.mark.parametrize("job", sorted((REPO / "jobs").glob("*.toml")), ids=lambda path: path.stem)
def test_every_shipped_job_is_estimated(job, capsys, offline_hub):
    assert main(["--config", str(job)], TrainerEnv()) == 0
    verdict = next(
        line for line in capsys.readouterr().out.splitlines() if line.startswith("your config")
    )
    assert "GiB per GPU" in verdict


@pytest.mark.parametrize(
    ("preset", "image_size", "batch"),
    [("resnet-tiny", 32, 8), ("resnet-18", 64, 4), ("resnet-50", 64, 2)],
)
def test_resnet_activations_match_the_memory_a_cpu_forward_holds(preset, image_size, batch):
    """The estimate counts on the meta device; PyTorch's MemTracker measures the
    activation memory a real fp32 forward on the CPU holds until the backward."""
    # Imported here: it imports torch.distributed.tensor, a second of every worker's start.
    from torch.distributed._tools.mem_tracker import MemTracker, _MemRefType

    config = load_config(
        None,
        [
            f"model.preset={preset}",
            "data.kind=image_folder",
            "data.num_classes=10",
            f"data.image_size={image_size}",
            f"train.micro_batch_size={batch}",
            f"train.global_batch_size={batch}",
        ],
    )
    counted = activations(config, batch, checkpointing=False)

    model = build_model(config)
    images = torch.randn(batch, 3, image_size, image_size)
    labels = torch.randint(0, 10, (batch,))
    tracker = MemTracker()
    tracker.track_external(model, images, labels)
    with tracker:
        loss = model(images, labels)
        held = tracker.get_tracker_snapshot("current")[torch.device("cpu")]
    measured = next(value for kind, value in held.items() if kind == _MemRefType.ACT)
    assert loss.requires_grad
    assert counted == pytest.approx(measured, rel=0.03)
    assert activations(config, batch, checkpointing=True) is None


def test_no_gpus_or_nodes_is_named(capsys):
    assert main(["--gpus", "0"], TrainerEnv()) == 2
    assert capsys.readouterr().err == "error: --gpus 0: a job needs at least 1 GPU\n"
    assert main(["--nodes", "0"], TrainerEnv()) == 2
    assert capsys.readouterr().err == "error: --nodes 0: a job needs at least 1 node\n"


def test_a_hugging_face_model_is_estimated_from_its_config_json_alone(tmp_path, capsys):
    """A folder holding only Llama-3.1-8B's config.json: no weights, no tokenizer, no data."""
    model = tmp_path / "llama-3.1-8b"
    model.mkdir()
    (model / "config.json").write_bytes(
        (HUB_CONFIGS / "meta-llama" / "Llama-3.1-8B" / "config.json").read_bytes()
    )
    job = tmp_path / "job.toml"
    job.write_text(
        f'[model]\nhf = "{model}"\nactivation_checkpointing = true\n'
        '[data]\nkind = "jsonl"\npath = "/no/such/data.jsonl"\nseq_len = 4096\n'
        "[train]\nmicro_batch_size = 1\n[zero]\nstage = 3\n[precision]\nbf16 = true\n"
    )
    args = ["--config", str(job), "--gpus", "8", "--gpu-type", "A100-80GB"]
    assert main(args, TrainerEnv()) == 0
    out = capsys.readouterr().out
    # Llama 3.1 8B's count from its shape: per layer q and o (4096²), k and v (4096 x 1024),
    # three MLP matrices (4096 x 14336), two norms; two 128256 x 4096 tables, a final norm.
    layer = 2 * 4096**2 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096
    params = 32 * layer + 2 * 128256 * 4096 + 4096
    assert f"{params / 1e9:.2f}B parameters (largest layer {128256 * 4096 / 1e6:.1f}M)" in out
    zero3 = next(line for line in out.splitlines() if line.startswith("ZeRO-3 "))
    _, states, _ = estimate_zero3_model_states_mem_needs(
        total_params=params,
        largest_layer_params=128256 * 4096,
        num_gpus_per_node=8,
        num_nodes=1,
        cpu_offload=False,
        cpu_offload_params=False,
    )
    assert zero3.split()[1] == f"{states / GIB:.2f}"  # DeepSpeed's figure per GPU
    verdict = next(line for line in out.splitlines() if line.startswith("your config"))
    assert verdict.startswith("your config  ZeRO-3, activation checkpointing: ")
    assert verdict.endswith("GiB per GPU: fits")


@pytest.mark.parametrize(
    "job",
    [
        p
        for p in sorted((REPO / "jobs").glob("*.toml"))
        if "# python -m training estimate" in p.read_text()
    ],
    ids=lambda path: path.stem,
)
def test_the_estimate_a_job_quotes_is_what_estimate_prints(job, capsys, offline_hub):
    """A shipped job that quotes its estimate in a comment quotes it as it is."""
    comment = [line.removeprefix("#").strip() for line in job.read_text().splitlines()]
    command = next(line for line in comment if line.startswith("python -m training estimate"))
    quoted = [line for line in comment if line.startswith(("model ", "ZeRO-", "your config"))]
    args = command.removeprefix("python -m training estimate").split()
    args[args.index("--config") + 1] = str(REPO / args[args.index("--config") + 1])
    assert main(args, TrainerEnv()) == 0
    printed = [" ".join(line.split()) for line in capsys.readouterr().out.splitlines()]
    assert quoted and all(" ".join(line.split()) in printed for line in quoted)
