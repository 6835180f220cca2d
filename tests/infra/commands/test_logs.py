"""`logs` against moto's CloudWatch Logs: every node's stream in time order, one node, follow."""

from __future__ import annotations

import io
import time

import pytest

from infra.commands import logs
from infra.errors import ConfigError
from infra.targets import FOLLOW_POLL_S
from tests.infra.commands.conftest import LOG_GROUP, log_args, stack_outputs


@pytest.fixture
def log_stack(aws, stub_stack):
    client = aws.client("logs")
    client.create_log_group(logGroupName=LOG_GROUP)
    for stream in ("node-0", "node-1"):
        client.create_log_stream(logGroupName=LOG_GROUP, logStreamName=stream)
    stub_stack.outputs_ = stack_outputs(["i-0", "i-1"], spot=False)
    return client


def put(client, stream, message, at_ms):
    client.put_log_events(
        logGroupName=LOG_GROUP,
        logStreamName=stream,
        logEvents=[{"timestamp": at_ms, "message": message}],
    )


def test_every_nodes_lines_in_time_order(log_stack):
    now = int(time.time() * 1000)
    put(log_stack, "node-1", "rank 1 ready", now - 2000)
    put(log_stack, "node-0", "step 10 loss 3.2", now - 1000)
    put(log_stack, "node-0", "too old", now - 2 * 3600 * 1000)
    out = io.StringIO()
    assert logs.run(log_args(), out=out) == ""
    lines = out.getvalue().splitlines()
    assert [line.split("  ")[0] for line in lines] == ["node-1", "node-0"]
    assert lines[0].endswith("rank 1 ready") and lines[1].endswith("step 10 loss 3.2")


def test_one_node(log_stack):
    now = int(time.time() * 1000)
    put(log_stack, "node-0", "zero", now - 1000)
    put(log_stack, "node-1", "one", now - 1000)
    out = io.StringIO()
    logs.run(log_args(node=1), out=out)
    assert out.getvalue().splitlines()[0].endswith("one") and "zero" not in out.getvalue()


def test_one_job_by_name_on_a_single_node_stack(log_stack):
    now = int(time.time() * 1000)
    for stream in ("job-lr-sweep", "job-default"):
        log_stack.create_log_stream(logGroupName=LOG_GROUP, logStreamName=stream)
    put(log_stack, "job-lr-sweep", "step 5 loss 2.1", now - 1000)
    put(log_stack, "job-default", "step 9 loss 1.7", now - 1000)
    put(log_stack, "node-0", "health: node fit for training", now - 2000)
    out = io.StringIO()
    logs.run(log_args(job="lr-sweep"), out=out)
    (line,) = out.getvalue().splitlines()
    assert line.startswith("job-lr-sweep  ") and line.endswith("step 5 loss 2.1")
    with pytest.raises(ConfigError, match=r"^--job 'a b': a job name is 1 to 63"):
        logs.run(log_args(job="a b"), out=io.StringIO())
    with pytest.raises(ConfigError, match="give one"):
        logs.run(log_args(job="lr-sweep", node=0), out=io.StringIO())


def test_follow_prints_new_lines_once_until_interrupted(log_stack):
    now = int(time.time() * 1000)
    put(log_stack, "node-0", "first", now - 1000)
    polls = []

    def sleep(seconds):
        polls.append(seconds)
        if len(polls) == 1:
            put(log_stack, "node-0", "second", int(time.time() * 1000))
        elif len(polls) == 3:
            raise KeyboardInterrupt  # Ctrl-C ends --follow quietly

    out = io.StringIO()
    logs.run(log_args(follow=True), out=out, sleep=sleep)
    messages = [line.rsplit("  ", 1)[1] for line in out.getvalue().splitlines()]
    assert messages == ["first", "second"]
    assert polls == [FOLLOW_POLL_S] * 3


def test_a_node_the_stack_does_not_have_is_refused(log_stack):
    with pytest.raises(ConfigError, match="has nodes 0 to 1"):
        logs.run(log_args(node=2), out=io.StringIO())


def test_a_log_group_not_there_yet_says_why(aws, stub_stack):
    stub_stack.outputs_ = stack_outputs(["i-0"], spot=False)
    with pytest.raises(ConfigError, match="not there yet"):
        logs.run(log_args(), out=io.StringIO())


@pytest.mark.parametrize("minutes", [0.0, -5.0, float("nan"), float("inf")])
def test_since_needs_minutes_above_0_before_the_stack_is_opened(stub_stack, minutes):
    with pytest.raises(ConfigError, match=f"--since {minutes:g}: give minutes above 0"):
        logs.run(log_args(since=minutes), out=io.StringIO())
    assert stub_stack.opened == []
