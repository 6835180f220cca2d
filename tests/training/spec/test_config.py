"""Config loading, overrides and the checks that run before anything is launched."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from tests.support.preloaded import run_module
from tests.training.multirank import REPO_ROOT, launch_env
from training.cli import main
from training.spec.config import (
    Config,
    ConfigError,
    TrainConfig,
    load_config,
    resolve_batch_sizes,
    validate,
)


def _error(tmp_path, *overrides: str, toml: str = "", world_size: int = 2) -> str:
    path = tmp_path / "job.toml"
    path.write_text(toml)
    with pytest.raises(ConfigError) as caught:
        validate(load_config(path, list(overrides), env={}), world_size)
    return str(caught.value)


# Each bad config, and words its one-line message must contain (the key and the bad value).
BAD_CONFIGS = [
    (["precision.fp16=true", "precision.bf16=true"], ["precision.fp16", "precision.bf16"]),
    (["zero.offload_param=true", "zero.stage=2"], ["zero.offload_param", "zero.stage = 3", "2"]),
    (["zero.offload_optimizer=true", "zero.stage=0"], ["zero.offload_optimizer", "got 0"]),
    (["train.global_batch_size=10", "train.micro_batch_size=4"], ["train.global_batch_size", "10"]),
    (
        [
            "train.global_batch_size=32",
            "train.micro_batch_size=4",
            "train.gradient_accumulation_steps=2",
        ],
        ["train.global_batch_size = 32", "4 x 2 x 2 = 16"],
    ),
    (["train.stepz=3"], ["train.stepz", "unknown key", "steps"]),
    (["zero.stage=4"], ["zero.stage", "4", "must be at most 3"]),
    (["model.preset=gpt-9000"], ["model.preset", "gpt-9000", "gpt-124m"]),
    (["model.builder=not an import"], ["model.builder", "not an import"]),
    (["model.n_head=3"], ["model.n_embd = 64", "model.n_head = 3"]),
    (["data.kind=tokens"], ["data.kind", "data.path"]),
    (["data.kind=text", "data.path=x.txt", "data.vocab_size=512"], ["data.vocab_size = 512"]),
    (["scheduler.warmup_steps=50", "train.steps=50"], ["scheduler.warmup_steps = 50"]),
    (["optimizer.lr=-1"], ["optimizer.lr", "-1"]),
    (["model.preset=resnet-50"], ["model.preset = 'resnet-50'", "data.kind = 'synthetic'"]),
    (
        ["data.kind=image_folder", "data.path=x", "data.num_classes=3"],
        ["data.kind = 'image_folder'", "model.preset = 'tiny'", "resnet-50"],
    ),
    (
        ["model.preset=resnet-18", "data.kind=image_shards", "data.path=x"],
        ["data.num_classes"],
    ),
    (
        [
            "model.preset=resnet-18",
            "data.kind=image_folder",
            "data.path=x",
            "data.num_classes=3",
            "model.activation_checkpointing=true",
        ],
        ["model.activation_checkpointing", "BatchNorm", "micro_batch_size"],
    ),
    (
        [
            "model.preset=resnet-50",
            "data.kind=image_folder",
            "data.path=x",
            "data.num_classes=3",
            "zero.stage=3",
        ],
        ["zero.stage = 3", "resnet-50", "zero.stage 0, 1 or 2"],
    ),
    (
        ["data.kind=tokens", "data.path=s3://b/tokens"],
        ["data.path = 's3://b/tokens'", "image_shards"],
    ),
    # Hugging Face models and text data.
    (["data.kind=jsonl", "data.path=x.jsonl"], ["data.kind = 'jsonl'", "set model.hf"]),
    (
        ["model.hf=m", "model.n_layer=4", "data.kind=jsonl", "data.path=x"],
        ["model.n_layer and model.hf", "config.json"],
    ),
    (["model.task=masked-lm"], ["model.task is set but model.hf is not"]),
    (
        ["model.hf=m", "data.kind=jsonl", "data.path=x", "model.task=sequence-classification"],
        ["model.num_labels"],
    ),
    (
        ["model.hf=m", "model.task=masked-lm"],
        ["model.task = 'masked-lm' with data.kind = 'synthetic'"],
    ),
    (
        [
            "model.hf=m",
            "data.kind=jsonl",
            "data.path=x",
            "data.val_path=v",
            "data.val_fraction=0.1",
        ],
        ["data.val_path and data.val_fraction"],
    ),
    (
        [
            "model.hf=m",
            "data.kind=jsonl",
            "data.path=x",
            "data.streaming=true",
            "data.val_fraction=0.1",
        ],
        ["data.val_fraction with data.streaming"],
    ),
    (["data.streaming=true"], ["data.streaming is set but data.kind = 'synthetic'"]),
    (
        ["model.hf=m", "data.kind=hf-dataset", "data.path=s3://b/x"],
        ["data.kind = 'hf-dataset' does not read from S3"],
    ),
    (
        ["model.hf=m", "data.kind=jsonl", "data.path=x", "data.subset=en"],
        ["data.subset is set but data.kind = 'jsonl'"],
    ),
    # Strict values: a run folder stays one folder under runs/, numbers have maxima,
    # booleans are booleans, NaN is not a number.
    (["run.name='../../x'"], ["run.name is '../../x'", "no '/'"]),
    (["run.name=''"], ["run.name is ''", "one folder name under runs/"]),
    (["run.name='.'"], ["run.name is '.'"]),
    (["run.name='a/b'"], ["run.name is 'a/b'"]),
    (["train.steps=1000000000000000000000"], ["train.steps", "must be at most 1000000000"]),
    (["train.micro_batch_size=100000000"], ["train.micro_batch_size", "must be at most"]),
    (["run.seed=-1"], ["run.seed is -1", "at least 0"]),
    (["precision.bf16=yes"], ["precision.bf16 is 'yes'", "boolean"]),
    (["precision.bf16=1"], ["precision.bf16 is 1", "boolean"]),
    (["optimizer.lr=nan"], ["optimizer.lr is nan", "finite"]),
    (["optimizer.lr=inf"], ["optimizer.lr is inf"]),
]


@pytest.mark.parametrize(("overrides", "words"), BAD_CONFIGS)
def test_bad_config_is_rejected_with_one_line_naming_the_key(tmp_path, overrides, words):
    message = _error(tmp_path, *overrides)
    assert "\n" not in message
    for word in words:
        assert word in message


def test_unknown_section_and_unknown_toml_key_are_rejected(tmp_path):
    assert "unknown key" in _error(tmp_path, toml="[trian]\nsteps = 3\n")
    message = _error(tmp_path, toml="[zero]\nstage = 1\noffload = true\n")
    assert message.startswith("zero.offload: unknown key")
    assert "offload_optimizer" in message


def test_missing_and_broken_files_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.toml", env={})
    broken = tmp_path / "broken.toml"
    broken.write_text("[run\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(broken, env={})


def test_set_overrides_parse_toml_values_and_bare_words(tmp_path):
    config = load_config(
        None,
        ["train.steps=7", "run.name=my-run", "optimizer.betas=[0.8, 0.9]", "zero.stage=3"],
        env={},
    )
    assert config.train.steps == 7
    assert config.run.name == "my-run"
    assert config.optimizer.betas == (0.8, 0.9)
    assert config.zero.stage == 3
    with pytest.raises(ConfigError, match=r"expected key\.sub=value"):
        load_config(None, ["train.steps"], env={})


def test_environment_overrides_sit_between_file_and_set(tmp_path):
    env = {"TRAIN_OUTPUT_DIR": "/out", "TRAIN_DATA_PATH": "/data", "TRAIN_CHECKPOINT_DIR": "/ck"}
    config = load_config(None, [], env=env)
    assert config.output_dir.as_posix() == "/out"
    assert config.data.path == "/data"
    assert config.checkpoint_dir.as_posix() == "/ck"
    assert load_config(None, ["data.path=/mine"], env=env).data.path == "/mine"
    defaults = load_config(None, [], env={})
    assert defaults.output_dir.as_posix() == "runs/demo"
    assert defaults.checkpoint_dir.as_posix() == "runs/demo/checkpoints"


def test_batch_sizes_any_two_determine_the_third():
    def sizes(world, **given):
        b = resolve_batch_sizes(TrainConfig(**given), world)
        return b.global_batch_size, b.micro_batch_size, b.gradient_accumulation_steps

    assert sizes(2, micro_batch_size=4, gradient_accumulation_steps=3) == (24, 4, 3)
    assert sizes(4, global_batch_size=64, micro_batch_size=8) == (64, 8, 2)
    assert sizes(4, global_batch_size=64, gradient_accumulation_steps=4) == (64, 4, 4)
    assert sizes(8, global_batch_size=64) == (64, 8, 1)
    assert sizes(2, global_batch_size=16, micro_batch_size=4, gradient_accumulation_steps=2) == (
        16,
        4,
        2,
    )
    assert sizes(3) == (3, 1, 1)


def test_cli_reports_bad_config_in_one_line_and_exits_2(capsys):
    assert main(["--set", "zero.stage=0", "--set", "zero.offload_optimizer=true"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("error: zero.offload_optimizer")


def test_launcher_rejects_bad_config_fast_without_traceback(tmp_path):
    """A `python -m training` process: exit 2 before any worker starts."""
    started = time.monotonic()
    result = run_module(
        "training",
        ["--set", "precision.fp16=true", "--set", "bf16=1"],
        cwd=tmp_path,
        env=launch_env(),
    )
    assert result.returncode == 2
    assert (
        result.stderr.strip()
        == "error: bf16: unknown key (known keys: "
        + ", ".join(
            [
                *("run", "model", "data", "train", "optimizer", "scheduler", "zero"),
                *("precision", "checkpoint", "logging", "watchdog", "parallel"),
            ]
        )
        + ")"
    )
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "runs").exists()
    assert time.monotonic() - started < 30


def test_the_gpu_example_config_is_valid_on_8_gpus():
    config = load_config(
        REPO_ROOT / "examples" / "gpt_350m_bf16.toml", env={"TRAIN_DATA_PATH": "/data/owt"}
    )
    batch = validate(config, world_size=8)
    assert (batch.micro_batch_size, batch.gradient_accumulation_steps) == (8, 8)
    assert config.precision.bf16 and config.model.preset == "gpt-350m"


def test_every_config_key_is_documented():
    docs = (REPO_ROOT / "docs" / "training.md").read_text()
    for section, field in Config.model_fields.items():
        assert f"[{section}]" in docs, section
        for key in field.annotation.model_fields:
            assert f"`{key}`" in docs or f"`{section}.{key}`" in docs, f"{section}.{key}"


def test_train_config_variable_names_the_config_file(tmp_path, monkeypatch, capsys):
    job = tmp_path / "job.toml"
    job.write_text("[zero]\nstage = 1\n[train]\nmicro_batch_size = 3\n")
    monkeypatch.setenv("TRAIN_CONFIG", str(job))
    monkeypatch.setenv("TRAIN_NPROC_PER_NODE", "2")
    monkeypatch.delenv("RANK", raising=False)
    assert main(["--print-ds-config"]) == 0
    ds = json.loads(capsys.readouterr().out)
    assert ds["zero_optimization"]["stage"] == 1
    assert ds["train_batch_size"] == 6
    # --config wins over TRAIN_CONFIG.
    assert main(["--config", str(tmp_path / "missing.toml"), "--print-ds-config"]) == 2


def test_the_config_check_runs_where_torch_is_not_installed():
    """The Pulumi program validates gpu:trainConfig with these modules in a venv without torch."""
    blocked = "import sys; sys.modules.update(dict.fromkeys(['torch', 'pynvml', 'deepspeed']))"
    check = (
        "from training.spec.config import load_config, validate;"
        "from training.spec.selfcheck import check_precision;"
        "validate(load_config(None, env={}), world_size=2);"
        "check_precision(bf16=True, fp16=False, on_gpu=True, capability=(8, 0))"
    )
    result = subprocess.run(
        [sys.executable, "-c", f"{blocked}; {check}"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
