"""A Hugging Face job's bad input fails in one line, exit 2, before any rank starts and with
nothing written: models the Hub does not have or will not give, no Hub at all, data
without the text field, a sequence past the model's positions, a tokenizer bigger than
the embeddings, a model whose own code would have to run.

The Hub is a loopback server that answers as huggingface.co does (HF_ENDPOINT): 404 with
X-Error-Code RepoNotFound for a model that does not exist, 401 with X-Error-Code
GatedRepo for a gated model without a token (huggingface_hub/utils/_http.py,
hf_raise_for_status); "no network" is a port nothing listens on."""

from __future__ import annotations

import http.server
import json
import subprocess
import threading

import pytest

from tests.training.jobs import job_command, job_env
from tests.training.multirank import REPO_ROOT, free_port
from tests.training.tiny_hf import save_model, write_jsonl
from training.cli import main


def write_job(folder, model: str, data, *settings: str):
    job = folder / "job.toml"
    lines = [
        "[model]",
        f'hf = "{model}"',
        "[data]",
        'kind = "jsonl"',
        f'path = "{data}"',
        *(settings or ["seq_len = 32"]),
    ]
    job.write_text("\n".join(lines) + "\n")
    return job


class FakeHub(http.server.BaseHTTPRequestHandler):
    """Every model is missing but those with "gated" in their name, which need a token."""

    def answer(self):
        if "gated" in self.path:
            status, code = 401, "GatedRepo"
            message = "Access to this model is restricted. You must be authenticated."
        else:
            status, code, message = 404, "RepoNotFound", "Repository not found"
        self.send_response(status)
        self.send_header("X-Error-Code", code)
        self.send_header("X-Error-Message", message)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_HEAD = answer

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def hub():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeHub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def assert_refused(code: int, stderr: str, words: str, output_dir) -> None:
    lines = stderr.strip().splitlines()
    assert code == 2, stderr[-3000:]
    assert len(lines) == 1, stderr
    assert lines[0].startswith("error: ") and words in lines[0], lines[0]
    assert "starting" not in stderr  # no worker was started
    assert not (output_dir / "metrics.jsonl").exists()


@pytest.mark.multiprocess
@pytest.mark.parametrize(
    ("model", "endpoint", "words"),
    [
        ("acme/no-such-model", "hub", "'acme/no-such-model' is not a model on the Hub"),
        ("acme/gated-model", "hub", "is a gated model and HF_TOKEN is not set"),
        pytest.param(
            "acme/any-model",
            "closed",
            "cannot reach the Hub at http://127.0.0.1:",
            marks=pytest.mark.slow(
                reason="huggingface_hub retries a refused connection for about 24 s before "
                "the one-line refusal",
                seconds=80,
            ),
        ),
    ],
    ids=["missing", "gated", "no-network"],
)
def test_what_the_hub_refuses_is_one_line(tmp_path, tiny_hf, hub, model, endpoint, words):
    # No network: huggingface_hub retries a refused connection 5 times over about 24 s
    # first (utils/_http.py, http_backoff), so a blip at a job's start is ridden out.
    endpoint = f"http://127.0.0.1:{free_port()}" if endpoint == "closed" else hub
    job = write_job(tmp_path, model, tiny_hf.corpus)
    env = job_env(tmp_path / "out", HF_ENDPOINT=endpoint, HF_HOME=str(tmp_path / "hf-home"))
    env.pop("HF_TOKEN", None)
    result = subprocess.run(
        job_command(config=job),
        env=env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert_refused(result.returncode, result.stderr, words, tmp_path / "out")
    assert not (tmp_path / "out" / "cache").exists()


def refused_in_process(tmp_path, monkeypatch, capsys, job, words: str) -> None:
    """The launcher's own checks, run in this process (`python -m training` minus the
    interpreter start): they refuse before any worker would start."""
    out = tmp_path / "out"
    monkeypatch.setenv("TRAIN_OUTPUT_DIR", str(out))
    monkeypatch.setenv("TRAIN_CACHE_DIR", str(out / "cache"))
    monkeypatch.setenv("TRAIN_SPOT_ENDPOINT", "")
    capsys.readouterr()  # what the test's own set-up printed
    code = main(["--config", str(job)])
    assert_refused(code, capsys.readouterr().err, words, out)
    tokens = out / "cache" / "tokens"
    assert not tokens.exists() or not any(p.name[0] != "." for p in tokens.iterdir())


def test_data_without_the_text_field_names_its_fields(tmp_path, tiny_hf, monkeypatch, capsys):
    data = write_jsonl(tmp_path / "notes.jsonl", [{"id": 1, "body": "the quick fox"}] * 3)
    job = write_job(tmp_path, tiny_hf.model, data)
    refused_in_process(
        tmp_path,
        monkeypatch,
        capsys,
        job,
        "has no field 'text' (data.text_field); its records have 'id', 'body'",
    )


def test_a_sequence_past_the_models_positions(tmp_path, tiny_hf, monkeypatch, capsys):
    job = write_job(tmp_path, tiny_hf.model, tiny_hf.corpus, "seq_len = 4096")
    refused_in_process(tmp_path, monkeypatch, capsys, job, "data.seq_len = 4096 is past model.hf")


def test_a_tokenizer_bigger_than_the_embeddings(tmp_path, tiny_hf, monkeypatch, capsys):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_hf.model)
    model = save_model(tmp_path / "model", tokenizer, vocab_size=len(tokenizer) - 40)
    job = write_job(tmp_path, model, tiny_hf.corpus)
    words = f"its tokenizer has {len(tokenizer)} tokens but the model's embeddings hold"
    refused_in_process(tmp_path, monkeypatch, capsys, job, words)


def test_a_model_with_its_own_code_needs_trust_remote_code(tmp_path, tiny_hf, monkeypatch, capsys):
    model = tmp_path / "custom"
    model.mkdir()
    auto_map = {
        "AutoConfig": "configuration_tiny.TinyConfig",
        "AutoModelForCausalLM": "modeling_tiny.TinyModel",
    }
    (model / "config.json").write_text(
        json.dumps({"model_type": "tiny-custom", "auto_map": auto_map, "vocab_size": 300})
    )
    (model / "configuration_tiny.py").write_text(
        "from transformers import PretrainedConfig\n\n\n"
        "class TinyConfig(PretrainedConfig):\n    model_type = 'tiny-custom'\n"
    )
    job = write_job(tmp_path, model, tiny_hf.corpus)
    refused_in_process(tmp_path, monkeypatch, capsys, job, "set model.trust_remote_code = true")
