"""The [parallel] section's checks, each a one-line refusal before any GPU is rented, and
`estimate`'s layout choice."""

from __future__ import annotations

from pathlib import Path

import pytest

from common.errors import ConfigError
from training.ds_config import build_ds_config
from training.environment import TrainerEnv
from training.estimate import main as estimate_main
from training.spec.config import load_config, validate
from training.spec.parallel import check_model_layout

HUB = Path(__file__).parents[1] / "data" / "hub"
HF_JOB = ["model.hf=/models/llama", "data.kind=jsonl", "data.path=/data/text.jsonl"]


def _config(tmp_path: Path, overrides: list[str]):
    """A job of its own keys only (the demo job names a built-in preset)."""
    job = tmp_path / "job.toml"
    job.write_text("")
    return load_config(job, overrides)


@pytest.mark.parametrize(
    ("overrides", "world", "per_node", "line"),
    [
        (
            ["parallel.tensor=3"],
            8,
            None,
            "parallel.tensor x parallel.sequence = 3 x 1 = 3 does not divide the world size 8: "
            "use a divisor of 8 (the data-parallel ranks are world / (tensor x sequence))",
        ),
        (
            ["parallel.tensor=8"],
            16,
            4,
            "parallel.tensor = 8 is more than the 4 GPUs of one node: a tensor group "
            "all-reduces inside every layer and must stay on one node's NVLink; use "
            "parallel.tensor <= 4",
        ),
        (
            ["parallel.tensor=2", "parallel.sequence=2"],
            8,
            None,
            "parallel.tensor = 2 with parallel.sequence = 2: DeepSpeed does not document AutoTP "
            "and Ulysses together; choose one (tensor for a model too big for a GPU, sequence "
            "for sequences too long for one)",
        ),
        (
            ["parallel.sequence=2", "data.seq_len=33"],
            2,
            None,
            "data.seq_len = 33 is not a multiple of parallel.sequence = 2: each rank takes an "
            "equal slice of every sequence",
        ),
        (
            ["parallel.sequence=2", "model.task=masked-lm"],
            2,
            None,
            "parallel.sequence = 2 needs model.task = 'causal-lm', not 'masked-lm': Ulysses "
            "attends causally over the gathered sequence and sums a loss per token; use "
            "parallel.sequence = 1",
        ),
        (
            ["parallel.partition_config={use_default_specs = false}"],
            2,
            None,
            "parallel.partition_config is set but parallel.tensor = 1: it says how "
            "tensor-parallel ranks split the layers (set parallel.tensor)",
        ),
    ],
    ids=["divides-world", "one-node", "tensor-and-sequence", "seq-len", "task", "partition"],
)
def test_each_bad_layout_is_refused_in_one_line(tmp_path, overrides, world, per_node, line):
    config = _config(tmp_path, [*HF_JOB, *overrides])
    with pytest.raises(ConfigError) as refused:
        validate(config, world, per_node)
    assert str(refused.value) == line


def test_tensor_parallelism_needs_a_hugging_face_model(tmp_path):
    with pytest.raises(ConfigError, match=r"^parallel.tensor = 2 needs a Hugging Face model"):
        validate(_config(tmp_path, ["parallel.tensor=2"]), 2)


def test_batch_sizes_count_data_parallel_ranks_and_deepspeed_gets_autotp(tmp_path):
    """8 ranks, tensor 4: 2 data-parallel ranks share a global batch of 16."""
    config = _config(tmp_path, [*HF_JOB, "parallel.tensor=4", "train.global_batch_size=16"])
    batch = validate(config, 8)
    assert (batch.micro_batch_size, batch.gradient_accumulation_steps) == (8, 1)
    ds = build_ds_config(config, batch, on_gpu=False)
    assert ds["tensor_parallel"] == {"autotp_size": 4}
    # DeepSpeed would check it against micro x accumulation x all 8 ranks.
    assert "train_batch_size" not in ds


def test_sequence_parallelism_gets_deepspeed_ulysses_and_keeps_the_global_batch(tmp_path):
    """8 ranks, sequence 2: 4 data-parallel ranks share a global batch of 16."""
    config = _config(tmp_path, [*HF_JOB, "parallel.sequence=2", "train.global_batch_size=16"])
    batch = validate(config, 8)
    assert (batch.micro_batch_size, batch.gradient_accumulation_steps) == (4, 1)
    ds = build_ds_config(config, batch, on_gpu=False)
    assert ds["sequence_parallel_size"] == 2
    # DeepSpeed counts it over world / sequence ranks: 4 x 1 x 4.
    assert ds["train_batch_size"] == 16


@pytest.mark.parametrize(
    ("heads", "kv_heads", "sequence", "line"),
    [
        (
            14,
            2,
            4,
            "parallel.sequence = 4 does not divide model.hf's 14 attention heads: each rank of "
            "a sequence group computes attention for an equal share of them; use a divisor of 14",
        ),
        (
            12,
            4,
            6,
            "parallel.sequence = 6 and model.hf's 4 key/value heads: neither divides the other, "
            "so they cannot be shared or copied evenly over the group; use a divisor or a "
            "multiple of 4",
        ),
        (32, 8, 16, None),  # 2 heads and a copy of 1 key/value head per rank
    ],
    ids=["heads", "kv-heads", "fits"],
)
def test_a_sequence_degree_must_share_the_heads_evenly(tmp_path, heads, kv_heads, sequence, line):
    from transformers import LlamaConfig

    config = _config(tmp_path, [*HF_JOB, f"parallel.sequence={sequence}"])
    shape = LlamaConfig(
        num_attention_heads=heads, num_key_value_heads=kv_heads, hidden_size=heads * 8
    )
    if line is None:
        assert check_model_layout(config, shape) == []
        return
    with pytest.raises(ConfigError) as refused:
        check_model_layout(config, shape)
    assert str(refused.value) == line


def _hf_config(name: str):
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(HUB / name)


def test_a_tensor_degree_past_the_key_value_heads_warns_of_idle_ranks(tmp_path):
    config = _config(tmp_path, [*HF_JOB, "parallel.tensor=4"])
    # Qwen2.5-0.5B has 2 key/value heads.
    (warning,) = check_model_layout(config, _hf_config("Qwen/Qwen2.5-0.5B-Instruct"))
    assert warning == (
        "warning: parallel.tensor = 4 does not divide model.hf's 2 key/value heads: 2 of 4 "
        "ranks hold no attention head, so attention does not speed up past that; use a "
        "divisor of 2"
    )
    assert check_model_layout(config, _hf_config("meta-llama/Llama-3.1-8B")) == []  # 8 heads


def test_a_model_with_no_tp_plan_and_no_preset_is_refused_with_the_fix(tmp_path):
    from transformers import GPT2Config

    config = _config(tmp_path, [*HF_JOB, "parallel.tensor=2"])
    with pytest.raises(ConfigError) as refused:
        check_model_layout(config, GPT2Config())
    assert "\n" not in str(refused.value)
    assert str(refused.value).startswith(
        "parallel.tensor = 2: model.hf = '/models/llama' (gpt2) has no tp_plan in transformers "
        "and no DeepSpeed AutoTP preset"
    )
    assert "parallel.partition_config" in str(refused.value)
    given = {"layer_specs": [{"patterns": [".*c_attn.weight$"], "partition_type": "column"}]}
    config = config.model_copy(
        update={"parallel": config.parallel.model_copy(update={"partition_config": given})}
    )
    assert check_model_layout(config, GPT2Config()) == []


def _llama_8b_job(tmp_path: Path, tensor: str) -> Path:
    model = tmp_path / "llama-3.1-8b"
    model.mkdir()
    (model / "config.json").write_bytes((HUB / "meta-llama/Llama-3.1-8B/config.json").read_bytes())
    job = tmp_path / "job.toml"
    job.write_text(
        f'[model]\nhf = "{model}"\nactivation_checkpointing = true\n'
        '[data]\nkind = "jsonl"\npath = "/no/such/data.jsonl"\nseq_len = 8192\n'
        "[train]\nmicro_batch_size = 1\n[zero]\nstage = 2\n[precision]\nbf16 = true\n"
        f"[parallel]\ntensor = {tensor}\n"
    )
    return job


def test_estimate_chooses_a_layout_for_an_8b_llama_and_refuses_tensor_3(tmp_path, capsys):
    """On 8 x A100-40GB, ZeRO-2 at seq_len 8192: tensor 1 does not fit, tensor 2 does."""
    args = ["--config", str(_llama_8b_job(tmp_path, '"auto"')), "--gpus", "8"]
    assert estimate_main([*args, "--gpu-type", "A100-40GB"], TrainerEnv()) == 0
    out = capsys.readouterr().out.splitlines()
    layout = next(line for line in out if line.startswith("layout"))
    assert layout.startswith(
        'layout       tensor 2 x sequence 1 x data 4: parallel.tensor = "auto": '
    )
    assert "GiB per GPU at tensor 1 is over the 36.0 GiB usable on A100-40GB" in layout
    assert layout.endswith("its layers split inside the node over NVLink")
    rows = {line.split("  ")[0].strip(): line for line in out if line.startswith("tensor ")}
    assert set(rows) == {f"tensor {t} x data {8 // t}" for t in (1, 2, 4, 8)}
    assert not rows["tensor 1 x data 8"].split()[-1].endswith("*")  # does not fit
    assert rows["tensor 2 x data 4"].endswith("*  <- chosen")

    (tmp_path / "3").mkdir()
    three = ["--config", str(_llama_8b_job(tmp_path / "3", "3")), "--gpus", "8"]
    assert estimate_main(three, TrainerEnv()) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("error: parallel.tensor x parallel.sequence = 3 x 1 = 3 does not divide")


def test_auto_at_start_without_a_gpu_is_tensor_1_and_says_why(tmp_path):
    from training.estimate import tensor_at_start

    config = _config(tmp_path, [*HF_JOB, 'parallel.tensor="auto"'])
    assert tensor_at_start(config, world_size=2, nodes=1) == (
        1,
        'parallel.tensor = "auto": tensor 1 (no GPU: nothing to split layers over)',
    )
