"""A third kind of stack is one new file: every command that acts on a running stack works
against tests/infra/commands/fake_target.py once its kind is registered, and no command
module names a kind of stack."""

from __future__ import annotations

import argparse
import ast
import io
from pathlib import Path

import pytest

from infra import targets
from infra.commands import cancel, down, jobs, logs, start, status, stop, up
from infra.commands import run as run_job
from infra.outputs import CLUSTER, SINGLE_NODE, written_by
from tests.infra.commands.conftest import BUCKET, stack_outputs
from tests.infra.commands.fake_target import FakeDeployment, FakeTarget
from tests.infra.commands.test_up import READY

COMMANDS = Path(__file__).resolve().parents[3] / "infra" / "commands"
TARGETS = COMMANDS.parent / "targets"
STACK = "a100x8"
JOB = "[train]\nsteps = 200\nglobal_batch_size = 16\nmicro_batch_size = 1\n"


@pytest.fixture
def fake(aws, stub_stack, monkeypatch):
    stub_stack.outputs_ = stack_outputs(["i-0"], spot=False)
    aws.client("s3").create_bucket(Bucket=BUCKET)
    # The stack's kind opens the fake, as a new kind's lines in _kinds and _deployments would.
    monkeypatch.setattr(targets, "_kinds", lambda: {SINGLE_NODE: FakeTarget})
    monkeypatch.setattr(targets, "_deployments", lambda: {SINGLE_NODE: FakeDeployment})
    monkeypatch.setattr(FakeTarget, "queue", {})
    monkeypatch.setattr(FakeTarget, "calls", [])
    monkeypatch.setattr(FakeDeployment, "calls", [])
    return stub_stack


def test_every_command_acts_through_the_stacks_target(fake, tmp_path, monkeypatch):
    config = tmp_path / "sweep.toml"
    config.write_text(JOB)
    monkeypatch.setenv("HF_TOKEN", "hf_x")
    run = argparse.Namespace(stack=STACK, config=config, code=None, name=None, overrides=[])
    said = run_job.run(run)
    assert said == "fake secret stored\njob sweep queued on the fake stack (code: False)"
    listed = jobs.run(argparse.Namespace(stack=STACK))
    # The job's progress is the target's to read, as its state is.
    assert listed.splitlines()[1].split()[:4] == ["sweep", "running", "5/200", "2.5000"]
    said = cancel.run(argparse.Namespace(stack=STACK, job="sweep"))
    assert said == "job sweep cancelled on the fake stack"
    assert FakeTarget.queue == {"sweep": "cancelled"}
    out = io.StringIO()
    logs.run(
        argparse.Namespace(stack=STACK, job="sweep", node=None, since=60, follow=False), out=out
    )
    assert out.getvalue() == "fake log of sweep\n"
    watch = argparse.Namespace(stack=STACK, watch=None)
    assert status.run(watch) == f"fake stack {STACK}: 1 job(s)"
    assert stop.run(argparse.Namespace(stack=STACK), out=io.StringIO()) == "fake stack stopped"
    assert start.run(argparse.Namespace(stack=STACK), out=io.StringIO()) == "fake stack started"
    said = io.StringIO()
    gone = down.run(
        argparse.Namespace(stack=STACK, yes=True, delete_data=False), out=said, sleep=lambda s: None
    )
    assert FakeTarget.calls == ["stop", "start", "before_destroy"]
    assert "fake jobs checkpointed" in said.getvalue()
    assert "  a fake volume (kept on purpose)" in str(gone).splitlines()
    assert fake.calls[-1][:1] == ("destroy",)


def test_preview_and_up_go_through_the_kinds_deployment(fake):
    said = up.run_preview(argparse.Namespace(stack="l4x1", policy_pack=True), out=io.StringIO())
    assert said.endswith("; a fake note")
    assert FakeDeployment.calls == ["check", "preview"]
    out = io.StringIO()
    args = argparse.Namespace(stack="l4x1", yes=True, policy_pack=True)
    said = up.run(args, out=out, probes=READY)
    assert FakeDeployment.calls[2:] == ["check", "prepare", "up"]
    assert "the fake change needs nothing" in out.getvalue()
    assert [call[0] for call in fake.calls if call[0] in ("preview", "up")] == ["preview", "up"]
    assert said.startswith("stack l4x1 is up: fake machines")


def test_targets_hold_one_file_per_kind():
    assert sorted(p.name for p in TARGETS.glob("*.py")) == [
        "__init__.py",
        "ec2_spool.py",
        "local.py",
        "slurm.py",
        "target.py",  # the protocol
    ]


# The outputs only one kind writes: a command reading one knows which kind it talks to.
ONE_KINDS_OUTPUTS = written_by(SINGLE_NODE) ^ written_by(CLUSTER)


def _kind_words(path: Path) -> list[str]:
    """Where `path` asks which kind of stack it talks to."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr in (
            "is_cluster",
            "kind",
            "cluster",
            *ONE_KINDS_OUTPUTS,
        ):
            found.append(f"line {node.lineno}: .{node.attr}")
        elif isinstance(node, ast.Name) and node.id in (
            "CLUSTER",
            "SINGLE_NODE",
            "SingleNodeOutputs",
            "ClusterOutputs",
        ):
            found.append(f"line {node.lineno}: {node.id}")
        # ("ec2" is also boto3's service name: the kind's constant is what a test would see.)
        elif isinstance(node, ast.Constant) and node.value == "slurm":
            found.append(f"line {node.lineno}: {node.value!r}")
    return found


def test_no_command_branches_on_the_kind_of_stack():
    asked = {path.name: _kind_words(path) for path in sorted(COMMANDS.glob("*.py"))}
    assert {name: words for name, words in asked.items() if words} == {}


def test_the_check_sees_a_kind_test(tmp_path):
    module = tmp_path / "m.py"
    module.write_text(
        "if stack.is_cluster or out.kind == CLUSTER or isinstance(out, ClusterOutputs):\n"
        "    x = 'slurm' + out.head_node\n"
    )
    assert len(_kind_words(module)) == 6
