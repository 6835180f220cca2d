"""Stop requests: SIGTERM/SIGINT and EC2 spot interruption notices.

The trainer asks ``should_stop()`` once per step. The answer is the MAX of
every rank's local flag, so all ranks stop after the same step and can write
one checkpoint together, whichever rank got the signal or the notice.

Spot notices come from the instance metadata service (IMDSv2): a session
token from ``PUT /latest/api/token``, then ``GET
/latest/meta-data/spot/instance-action``, which answers 404 until EC2 plans
to reclaim the instance (about two minutes ahead) and then 200 with
``{"action": "terminate", "time": "2026-01-01T00:00:00Z"}``.
"""

from __future__ import annotations

import json
import logging
import signal
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import torch
import torch.distributed as dist

from training.environment import TrainerEnv

log = logging.getLogger(__name__)

IMDS_ENDPOINT = "http://169.254.169.254"
TOKEN_TTL_S = 21600  # the IMDSv2 maximum; the token is renewed well before it ends
_TOKEN_RENEW_S = TOKEN_TTL_S - 600
_HTTP_TIMEOUT_S = 2.0


def running_on_ec2(sys_root: Path = Path("/sys")) -> bool:
    """Whether this machine is an EC2 instance, read from the firmware, without a network call.

    Nitro instances report "Amazon EC2" as the DMI system vendor; Xen ones (P3) have a
    hypervisor UUID starting with "ec2". Both are readable inside a container.
    """
    for path, prefix in (
        ("devices/virtual/dmi/id/sys_vendor", "Amazon EC2"),
        ("hypervisor/uuid", "ec2"),
    ):
        try:
            if (sys_root / path).read_text().strip().lower().startswith(prefix.lower()):
                return True
        except OSError:
            continue
    return False


def spot_endpoint_from_env(env: TrainerEnv, *, on_ec2: bool | None = None) -> str | None:
    """The metadata service this worker polls for spot notices, or None.

    Only each node's first rank polls; should_stop's all-reduce tells the others.
    TRAIN_SPOT_ENDPOINT wins (empty turns polling off); unset, poll the real service only on
    EC2, so a laptop or CI machine never sends requests to a link-local address.
    """
    if env.local_rank != 0:
        return None
    if env.spot_endpoint is not None:
        return env.spot_endpoint or None
    return IMDS_ENDPOINT if (running_on_ec2() if on_ec2 is None else on_ec2) else None


class StopFlag:
    def __init__(self, *, spot_endpoint: str | None, poll_interval_s: float = 5.0):
        if poll_interval_s <= 0:
            raise ValueError(f"poll_interval_s={poll_interval_s!r} must be a positive number")
        self.spot_endpoint = spot_endpoint.rstrip("/") if spot_endpoint else None
        self.poll_interval_s = poll_interval_s
        self.reason: str | None = None
        self._local = threading.Event()
        self._closed = threading.Event()
        self._poller: threading.Thread | None = None
        self._started = False
        self._token: str | None = None
        self._token_time = 0.0

    def start(self) -> None:
        """Install the signal handlers and, with a spot endpoint, the spot poller."""
        if self._started:
            return
        self._started = True
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        if self.spot_endpoint:
            self._poller = threading.Thread(target=self._poll, name="spot-notice", daemon=True)
            self._poller.start()

    def close(self) -> None:
        """Stop the poller thread (signal handlers stay: a late SIGTERM still counts)."""
        self._closed.set()
        if self._poller is not None:
            self._poller.join(timeout=_HTTP_TIMEOUT_S * 2 + self.poll_interval_s)

    def request_stop(self, reason: str) -> None:
        if not self._local.is_set():
            self.reason = reason
            self._local.set()
            log.warning("stop requested (%s): finishing this step and checkpointing", reason)

    def should_stop(self) -> bool:
        """True on every rank once any rank's flag is set. Every rank must call it."""
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return self._local.is_set()
        device = "cuda" if dist.get_backend() == "nccl" else "cpu"
        flag = torch.tensor([1 if self._local.is_set() else 0], dtype=torch.int32, device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        stop = bool(flag.item())
        if stop and self.reason is None:
            self.reason = "stop requested on another rank"
        return stop

    def _on_signal(self, signum: int, _frame) -> None:
        name = signal.Signals(signum).name
        if signum == signal.SIGINT and self._local.is_set():
            raise KeyboardInterrupt  # a second Ctrl-C stops without waiting for the checkpoint
        self.request_stop(name)

    # ------------------------------------------------------------ spot notice

    def _poll(self) -> None:
        last_error = None
        while not self._closed.is_set() and not self._local.is_set():
            try:
                notice = self._fetch_notice()
            except Exception as exc:
                # Whatever goes wrong with the metadata service must not end training
                # nor this thread; say so once per distinct error.
                error = f"{type(exc).__name__}: {exc}"
                if error != last_error:
                    log.warning("spot notice check at %s failed: %s", self.spot_endpoint, error)
                last_error = error
            else:
                last_error = None
                if notice is not None:
                    action = notice.get("action", "terminate")
                    self.request_stop(f"spot interruption: {action} at {notice.get('time', '?')}")
                    return
            self._closed.wait(self.poll_interval_s)

    def _fetch_notice(self) -> dict | None:
        """The pending instance-action notice, or None while there is none."""
        for attempt in range(2):
            request = urllib.request.Request(
                f"{self.spot_endpoint}/latest/meta-data/spot/instance-action",
                headers={"X-aws-ec2-metadata-token": self._session_token()},
            )
            try:
                with urllib.request.urlopen(request, timeout=_HTTP_TIMEOUT_S) as response:
                    return json.loads(response.read())
            except urllib.error.HTTPError as exc:
                if exc.code == 404:
                    return None
                if exc.code == 401 and attempt == 0:
                    self._token = None  # expired or rejected: fetch a new one and retry
                    continue
                raise
        return None

    def _session_token(self) -> str:
        if self._token is None or time.monotonic() - self._token_time > _TOKEN_RENEW_S:
            request = urllib.request.Request(
                f"{self.spot_endpoint}/latest/api/token",
                method="PUT",
                headers={"X-aws-ec2-metadata-token-ttl-seconds": str(TOKEN_TTL_S)},
            )
            with urllib.request.urlopen(request, timeout=_HTTP_TIMEOUT_S) as response:
                self._token = response.read().decode()
            self._token_time = time.monotonic()
        return self._token
