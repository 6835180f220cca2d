"""StopFlag: real signals, a fake IMDSv2 service on loopback, and 2 real ranks."""

from __future__ import annotations

import json
import logging
import os
import signal
import time
from pathlib import Path

import pytest

from tests.training.fake_imds import NOTICE_PATH, TOKEN_PATH, FakeImds
from tests.training.multirank import free_port, torchrun
from training.environment import TrainerEnv
from training.interrupt import IMDS_ENDPOINT, StopFlag, running_on_ec2, spot_endpoint_from_env

WORKER = Path(__file__).with_name("stop_worker.py")
POLL_S = 0.05


@pytest.fixture(autouse=True)
def restore_signal_handlers():
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


@pytest.fixture
def imds():
    with FakeImds() as server:
        yield server


def wait_until(predicate, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_sets_the_flag(sig):
    flag = StopFlag(spot_endpoint=None)
    flag.start()
    assert not flag.should_stop() and flag.reason is None
    os.kill(os.getpid(), sig)
    assert wait_until(flag.should_stop, 2)
    assert flag.reason == sig.name


def test_second_ctrl_c_interrupts_at_once():
    flag = StopFlag(spot_endpoint=None)
    flag.start()
    os.kill(os.getpid(), signal.SIGINT)
    assert wait_until(flag.should_stop, 2)
    with pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(1)


def test_spot_notice_sets_the_flag_within_a_poll_interval(imds):
    flag = StopFlag(spot_endpoint=imds.url, poll_interval_s=POLL_S)
    flag.start()
    try:
        assert wait_until(lambda: imds.count("GET", NOTICE_PATH, 404) >= 3, 5)
        assert not flag.should_stop()
        noticed = time.monotonic()
        imds.notify("terminate", "2026-11-30T12:02:00Z")
        assert wait_until(flag.should_stop, 5)
        assert time.monotonic() - noticed < POLL_S + 1.0
        assert flag.reason == "spot interruption: terminate at 2026-11-30T12:02:00Z"
        # One session token serves every poll; the real service would 401 a GET without one.
        assert imds.count("PUT", TOKEN_PATH, 200) == 1
        assert imds.count("GET", NOTICE_PATH, 401) == 0
    finally:
        flag.close()


def test_expired_token_is_renewed(imds):
    flag = StopFlag(spot_endpoint=imds.url, poll_interval_s=POLL_S)
    flag.start()
    try:
        assert wait_until(lambda: imds.count("GET", NOTICE_PATH, 404) >= 2, 5)
        imds.revoke_tokens()
        imds.notify("stop", "2026-11-30T12:05:00Z")
        assert wait_until(flag.should_stop, 5)
        assert flag.reason == "spot interruption: stop at 2026-11-30T12:05:00Z"
        assert imds.count("GET", NOTICE_PATH, 401) == 1
        assert imds.count("PUT", TOKEN_PATH, 200) == 2
    finally:
        flag.close()


def test_fake_imds_enforces_tokens_like_the_real_one(imds):
    import urllib.error
    import urllib.request

    with pytest.raises(urllib.error.HTTPError) as no_token:
        urllib.request.urlopen(imds.url + NOTICE_PATH, timeout=2)
    assert no_token.value.code == 401
    no_ttl = urllib.request.Request(imds.url + TOKEN_PATH, method="PUT")
    with pytest.raises(urllib.error.HTTPError) as missing_ttl:
        urllib.request.urlopen(no_ttl, timeout=2)
    assert missing_ttl.value.code == 400


def test_unreachable_metadata_service_is_logged_once_and_never_stops(caplog):
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    flag = StopFlag(spot_endpoint=dead, poll_interval_s=POLL_S)
    with caplog.at_level(logging.WARNING, logger="training.interrupt"):
        flag.start()
        time.sleep(10 * POLL_S)
        flag.close()
    assert not flag.should_stop()
    failures = [r for r in caplog.records if "spot notice check" in r.getMessage()]
    assert len(failures) == 1 and dead in failures[0].getMessage()


def test_poller_runs_only_on_each_nodes_first_rank(imds):
    imds.notify("terminate", "2026-11-30T12:02:00Z")
    second_rank = TrainerEnv.from_environ({"LOCAL_RANK": "1", "TRAIN_SPOT_ENDPOINT": imds.url})
    flag = StopFlag(spot_endpoint=spot_endpoint_from_env(second_rank), poll_interval_s=POLL_S)
    flag.start()
    time.sleep(10 * POLL_S)
    flag.close()
    assert imds.requests == []
    assert not flag.should_stop()


def test_poll_interval_must_be_positive():
    with pytest.raises(ValueError, match="poll_interval_s=0"):
        StopFlag(spot_endpoint=None, poll_interval_s=0)


# ------------------------------------------------------------ two real ranks


def run_two_ranks(tmp_path: Path, *args: str, trigger) -> list[dict]:
    job = torchrun(WORKER, 2, str(tmp_path), *args)
    try:
        assert wait_until(lambda: all((tmp_path / f"pid-{r}").exists() for r in (0, 1)), 60)
        time.sleep(0.5)  # a few steps in
        trigger()
        assert job.wait(timeout=60) == 0
    finally:
        if job.poll() is None:
            job.kill()
    return [json.loads((tmp_path / f"stopped-{r}.json").read_text()) for r in (0, 1)]


@pytest.mark.multiprocess
def test_signal_to_one_rank_stops_both_at_the_same_step(tmp_path):
    def signal_rank1():
        os.kill(int((tmp_path / "pid-1").read_text()), signal.SIGTERM)

    stopped = run_two_ranks(tmp_path, trigger=signal_rank1)
    assert stopped[0]["step"] == stopped[1]["step"] > 1
    assert stopped[1]["reason"] == "SIGTERM"
    assert stopped[0]["reason"] == "stop requested on another rank"


@pytest.mark.multiprocess
def test_spot_notice_stops_both_ranks_at_the_same_step(tmp_path, imds):
    def notice():
        imds.notify("terminate", "2026-11-30T12:02:00Z")

    stopped = run_two_ranks(tmp_path, imds.url, trigger=notice)
    assert stopped[0]["step"] == stopped[1]["step"] > 1
    assert stopped[0]["reason"] == "spot interruption: terminate at 2026-11-30T12:02:00Z"
    assert stopped[1]["reason"] == "stop requested on another rank"


def fake_sys(tmp_path: Path, files: dict[str, str]) -> Path:
    for relative, text in files.items():
        path = tmp_path / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


@pytest.mark.parametrize(
    ("files", "on_ec2"),
    [
        ({"devices/virtual/dmi/id/sys_vendor": "Amazon EC2\n"}, True),  # Nitro (p4d, p5, g5)
        ({"hypervisor/uuid": "ec2e1916-9099-7caf-fd21-012345abcdef\n"}, True),  # Xen (p3)
        ({"devices/virtual/dmi/id/sys_vendor": "LENOVO\n"}, False),
        ({"hypervisor/uuid": "4a8d7e2f-0000-0000-0000-000000000000\n"}, False),
        ({}, False),
    ],
)
def test_ec2_is_recognised_from_the_firmware(tmp_path, files, on_ec2):
    assert running_on_ec2(fake_sys(tmp_path, files)) is on_ec2


def test_spot_endpoint_defaults_to_the_metadata_service_only_on_ec2():
    def endpoint(environ: dict[str, str], on_ec2: bool) -> str | None:
        return spot_endpoint_from_env(TrainerEnv.from_environ(environ), on_ec2=on_ec2)

    assert endpoint({}, on_ec2=True) == IMDS_ENDPOINT
    # A laptop or CI machine sends nothing to a link-local address.
    assert endpoint({}, on_ec2=False) is None
    assert endpoint({"TRAIN_SPOT_ENDPOINT": ""}, on_ec2=True) is None
    assert endpoint({"TRAIN_SPOT_ENDPOINT": "http://127.0.0.1:9"}, on_ec2=False) == (
        "http://127.0.0.1:9"
    )
    # Each node's first rank polls; the others hear of a notice through should_stop.
    assert endpoint({"LOCAL_RANK": "1"}, on_ec2=True) is None
