"""A loopback stand-in for the EC2 instance metadata service, IMDSv2 rules included.

Like the real service it hands out session tokens on ``PUT /latest/api/token``
(the TTL header is required, 1-21600 s), answers 401 to a GET without a valid
token, and serves ``/latest/meta-data/spot/instance-action``: 404 until a
notice is set, then 200 with the notice as JSON.

    with FakeImds() as imds:
        imds.url                     # http://127.0.0.1:PORT
        imds.notify("terminate", "2026-01-01T00:02:00Z")
"""

from __future__ import annotations

import json
import secrets
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TOKEN_PATH = "/latest/api/token"
NOTICE_PATH = "/latest/meta-data/spot/instance-action"


class FakeImds:
    def __init__(self) -> None:
        self.notice: dict | None = None
        self.tokens: set[str] = set()
        self.requests: list[tuple[str, str, int]] = []  # (method, path, status)
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def notify(self, action: str, time: str) -> None:
        self.notice = {"action": action, "time": time}

    def revoke_tokens(self) -> None:
        """Expire every token, as the real service does when a TTL runs out."""
        with self._lock:
            self.tokens.clear()

    def count(self, method: str, path: str, status: int | None = None) -> int:
        with self._lock:
            return sum(
                1
                for m, p, s in self.requests
                if m == method and p == path and (status is None or s == status)
            )

    def notice_read(self) -> bool:
        """Whether a poller has fetched the notice set (a 200 from the notice path)."""
        return self.count("GET", NOTICE_PATH, 200) > 0

    def __enter__(self) -> FakeImds:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()


def _handler_for(imds: FakeImds) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_PUT(self) -> None:
            if self.path != TOKEN_PATH:
                return self._reply(404)
            ttl = self.headers.get("X-aws-ec2-metadata-token-ttl-seconds", "")
            if not ttl.isdigit() or not 1 <= int(ttl) <= 21600:
                return self._reply(400)
            token = secrets.token_urlsafe(32)
            with imds._lock:
                imds.tokens.add(token)
            self._reply(200, token.encode())

        def do_GET(self) -> None:
            with imds._lock:
                authorised = self.headers.get("X-aws-ec2-metadata-token") in imds.tokens
            if not authorised:
                return self._reply(401)
            if self.path != NOTICE_PATH or imds.notice is None:
                return self._reply(404)
            self._reply(200, json.dumps(imds.notice).encode())

        def _reply(self, status: int, body: bytes = b"") -> None:
            with imds._lock:
                imds.requests.append((self.command, self.path, status))
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:  # keep test output quiet
            pass

    return Handler
