"""Loopback stand-ins for a Web Push service and an ntfy server, and a subscriber's keys.

The push stand-in records each request and answers with the next status of its script (201 by
default); a subscriber's private key and auth secret decrypt what it received (RFC 8291, aes128gcm),
so the test reads exactly what the phone would show.
"""

from __future__ import annotations

import base64
import json
import os
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import http_ece
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from tests.wait import until_blocking


def b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


@dataclass
class Subscriber:
    """A browser's side of a push subscription: the keys a real PushSubscription would hold."""

    endpoint: str
    private_key: ec.EllipticCurvePrivateKey = field(default_factory=lambda: ec.generate_private_key(ec.SECP256R1()))
    auth: bytes = field(default_factory=lambda: os.urandom(16))

    @property
    def p256dh(self) -> str:
        return b64url(self.private_key.public_key().public_bytes(
            serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint))

    def json(self) -> dict[str, Any]:
        return {"endpoint": self.endpoint, "expirationTime": None,
                "keys": {"p256dh": self.p256dh, "auth": b64url(self.auth)}}

    def decrypt(self, body: bytes) -> dict[str, Any]:
        payload: dict[str, Any] = json.loads(http_ece.decrypt(body, private_key=self.private_key,
                                                              auth_secret=self.auth, version="aes128gcm"))
        return payload


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes


class StandIn(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, statuses: list[int] | None = None):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.statuses = list(statuses or [])
        self.received: list[Received] = []
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def next_status(self) -> int:
        with self.lock:
            return self.statuses.pop(0) if self.statuses else 201

    def wait_for(self, n: int, timeout: float = 60) -> list[Received]:
        until_blocking(lambda: len(self.received) >= n,
                       lambda: f"{n} requests at the stand-in (it got {len(self.received)})", timeout, every=0.05)
        return list(self.received)

    def __enter__(self) -> StandIn:
        threading.Thread(target=self.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
        self.server_close()


class _Handler(BaseHTTPRequestHandler):
    server: StandIn

    def do_POST(self) -> None:  # noqa: N802 - the http.server API
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length)
        with self.server.lock:
            self.server.received.append(Received(self.path, {k.lower(): v for k, v in self.headers.items()}, body))
        status = self.server.next_status()
        self.send_response(status)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass
