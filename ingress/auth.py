"""Authentication and request hygiene as pure ASGI middleware (no BaseHTTPMiddleware around SSE).

Modes: open (trust the network), proxy (X-Authentik-Username set by the fronting proxy, optionally
limited to an allow-list; counted only from the proxy itself: a peer in PETAL_TRUSTED_PROXIES that sends
PETAL_PROXY_SECRET as X-Petal-Proxy-Secret), token (a shared secret: bearer
header, or the cookie /login sets; wrong guesses are rate-limited per client).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import time
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import SecretStr
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ingress.boundary import BoundaryConfig, forwarded, peer
from ingress.problems import problem

PROXY_HEADER = b"x-authentik-username"
COOKIE = "petal_session"
# Reachable without credentials: liveness, readiness, and the way in.
PUBLIC_PATHS = frozenset({"/healthz", "/readyz", "/login", "/openapi.json"})
# Routes that check a credential of their own instead of the user's: a routine's fire token, a webhook's HMAC
# (ingress/routines.py), a notification's one-use answer token (ingress/notify.py). A webhook's body may be
# larger than the API's usual limit, up to HOOK_BODY_BYTES.
SELF_AUTHENTICATED = re.compile(r"^/api/(hooks/[0-9a-fA-F-]{36}|routines/[0-9a-fA-F-]{36}/fire|notify/act)$")
HOOK_BODY_BYTES = 1024 * 1024
_STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
# Wrong tokens (bearer or /login) a client may send per window before it gets 429.
FAILURES_PER_WINDOW = 10
FAILURE_WINDOW_S = 60.0
# Wrong tokens per peer address, whatever client its X-Forwarded-For names: loopback is the default trusted
# proxy, so any local process could name a new client for each guess. Above any real proxy's honest traffic.
PEER_FAILURES_PER_WINDOW = 60
_LIMITER_CLIENTS = 10_000
# The one route that takes a file instead of JSON (multipart/form-data): an attachment of at most
# upload_max_bytes (by default, and at most, the store's limit ATTACHMENT_MAX_BYTES), its body capped a little
# above that for the multipart framing (the route checks the file's own size exactly). Cross-site forms are
# still refused by the boundary's Origin check, and the token mode's cookie is SameSite=Strict.
UPLOAD_PATH = "/api/attachments"
ATTACHMENT_MAX_BYTES = 10 * 1024 * 1024
MULTIPART_FRAMING_BYTES = 64 * 1024  # memory bound: the least recently failing clients are forgotten first


@dataclass(frozen=True)
class AuthConfig:
    mode: Literal["open", "proxy", "token"]
    allowed_users: frozenset[str] = frozenset()
    token: SecretStr | None = None
    max_body_bytes: int = 256 * 1024
    upload_max_bytes: int = ATTACHMENT_MAX_BYTES  # one attachment's file

    def cookie_value(self) -> str:
        # the cookie carries a MAC of the token, never the token itself
        assert self.token is not None
        return hmac.new(self.token.get_secret_value().encode(), b"petal-dispatch session", hashlib.sha256).hexdigest()


def _headers(scope: Scope) -> dict[bytes, bytes]:
    return {k.lower(): v for k, v in scope.get("headers", [])}


def _cookie(headers: dict[bytes, bytes], name: str) -> str | None:
    raw = headers.get(b"cookie", b"").decode("latin-1")
    for part in raw.split(";"):
        key, _, value = part.strip().partition("=")
        if key == name:
            return value
    return None


def same_secret(given: str, expected: SecretStr | str | None) -> bool:
    if expected is None:
        return False
    want = expected.get_secret_value() if isinstance(expected, SecretStr) else expected
    # bytes: compare_digest refuses non-ASCII str (a 500), and bytes compare in constant time
    return hmac.compare_digest(given.encode("utf-8", "surrogatepass"), want.encode("utf-8", "surrogatepass"))


class FailureLimiter:
    """A sliding window of failed attempts per client; pure apart from the clock passed in."""

    def __init__(self, limit: int = FAILURES_PER_WINDOW, window_s: float = FAILURE_WINDOW_S):
        self.limit = limit
        self.window_s = window_s
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()

    def retry_after(self, client: str, now: float | None = None) -> float:
        """Seconds until the client may try again; 0 when it may now."""
        now = time.monotonic() if now is None else now
        seen = self._failures.get(client)
        if not seen:
            return 0.0
        while seen and seen[0] <= now - self.window_s:
            seen.popleft()
        return seen[0] + self.window_s - now if len(seen) >= self.limit else 0.0

    def fail(self, client: str, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        seen = self._failures.pop(client, None) or deque(maxlen=self.limit)
        seen.append(now)
        self._failures[client] = seen
        while len(self._failures) > _LIMITER_CLIENTS:
            self._failures.popitem(last=False)


class TokenLimiter:
    """Wrong tokens counted per client (as a trusted proxy names it) and per peer address (the connection)."""

    def __init__(self) -> None:
        self.clients = FailureLimiter()
        self.peers = FailureLimiter(limit=PEER_FAILURES_PER_WINDOW)

    def retry_after(self, client: str, peer_address: str | None) -> float:
        return max(self.clients.retry_after(client), self.peers.retry_after(peer_address or "unknown"))

    def fail(self, client: str, peer_address: str | None) -> None:
        self.clients.fail(client)
        self.peers.fail(peer_address or "unknown")


def too_many(wait_s: float) -> JSONResponse:
    response = problem(429, f"too many wrong tokens from this client: try again in {int(wait_s) + 1} s")
    response.headers["retry-after"] = str(int(wait_s) + 1)
    return response


def identify(config: AuthConfig, headers: dict[bytes, bytes]) -> tuple[int, str]:
    """(0, user) when allowed, else (status, reason)."""
    if config.mode == "open":
        return 0, "open"
    if config.mode == "proxy":
        user = headers.get(PROXY_HEADER, b"").decode("latin-1").strip()
        if not user:
            return 401, "missing X-Authentik-Username: requests must come through the authenticating proxy"
        if config.allowed_users and user not in config.allowed_users:
            return 403, f"user {user!r} is not on the allow-list"
        return 0, user
    auth = headers.get(b"authorization", b"").decode("latin-1")
    if auth.lower().startswith("bearer "):
        if same_secret(auth[7:].strip(), config.token):
            return 0, "token"
        return 401, "wrong token"
    cookie = _cookie(headers, COOKIE)
    if cookie and same_secret(cookie, config.cookie_value()):
        return 0, "token"
    return 401, "a token is required: Authorization: Bearer <token>, or sign in at /login"


class GuardMiddleware:
    """Auth, JSON-only state changes, and a body size limit, before any route runs."""

    def __init__(self, app: ASGIApp, config: AuthConfig, boundary: BoundaryConfig, limiter: TokenLimiter):
        self.app = app
        self.config = config
        self.boundary = boundary
        self.limiter = limiter

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = _headers(scope)
        path: str = scope["path"]
        refusal = self._refusal(scope, headers, path)
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        await self.app(scope, _limited(receive, self._limit(scope["method"], path)), send)

    def _refusal(self, scope: Scope, headers: dict[bytes, bytes], path: str) -> ASGIApp | None:
        """The answer to a request refused before any route (the user set in the scope when it may go on)."""
        if "\x00" in path or b"%00" in scope.get("query_string", b"").lower():
            return problem(400, "the URL may not contain NUL characters")
        if path not in PUBLIC_PATHS and not SELF_AUTHENTICATED.match(path):
            refused = self._authenticate(scope, headers, path)
            if refused is not None:
                return refused
        return self._refuse_body(scope["method"], path, headers)

    def _authenticate(self, scope: Scope, headers: dict[bytes, bytes], path: str) -> ASGIApp | None:
        """Who the user is, set in the scope; else the refusal (a wrong bearer token counted by the limiter)."""
        status, reason = self._identify(scope, headers)
        bearer = headers.get(b"authorization", b"").lower().startswith(b"bearer ")
        if self.config.mode == "token" and bearer:
            client = forwarded(self.boundary, scope)[1]
            wait = self.limiter.retry_after(client, peer(scope))
            if wait:
                return too_many(wait)
            if status:
                self.limiter.fail(client, peer(scope))
        if status:
            if self.config.mode == "token" and scope["method"] == "GET" and not path.startswith("/api/"):
                return _redirect_to("/login")
            return problem(status, reason)
        scope.setdefault("state", {})["user"] = reason
        return None

    def _identify(self, scope: Scope, headers: dict[bytes, bytes]) -> tuple[int, str]:
        """`identify`, and in proxy mode only from the proxy itself."""
        status, reason = identify(self.config, headers)
        if self.config.mode != "proxy":
            return status, reason
        if not self.boundary.trusts(peer(scope)):
            # the identity header is only as good as whoever set it: only a trusted proxy may
            return 401, (f"{peer(scope)} is not a trusted proxy (PETAL_TRUSTED_PROXIES): requests "
                         "must come through the authenticating proxy")
        if not self.boundary.secret_matches(scope):
            # any process on the machine is on loopback: only the proxy knows the secret
            return 401, ("missing or wrong proxy secret (X-Petal-Proxy-Secret): requests must come "
                         "through the authenticating proxy")
        return status, reason

    def _limit(self, method: str, path: str) -> int:
        """The most a request's body may hold: an upload its file's limit and the multipart framing, a webhook
        its own, else the API's."""
        if method == "POST" and path == UPLOAD_PATH:
            return self.config.upload_max_bytes + MULTIPART_FRAMING_BYTES
        return HOOK_BODY_BYTES if path.startswith("/api/hooks/") else self.config.max_body_bytes

    def _refuse_body(self, method: str, path: str, headers: dict[bytes, bytes]) -> ASGIApp | None:
        """A state change without the body type its route takes (415), or a body over its limit (413)."""
        upload = method == "POST" and path == UPLOAD_PATH
        length = int(headers.get(b"content-length", b"0") or 0)
        if method in _STATE_CHANGING and path != "/login":
            has_body = length > 0 or b"transfer-encoding" in headers
            ctype = headers.get(b"content-type", b"").split(b";")[0].strip().lower()
            wanted, what = ((b"multipart/form-data", "an attachment is uploaded as a file") if upload
                            else (b"application/json", "state-changing requests take a JSON body"))
            if (has_body or method in ("POST", "PUT", "PATCH")) and ctype != wanted:
                return problem(415, f"{what} (Content-Type: {wanted.decode()})")
        limit = self._limit(method, path)
        if length > limit:
            # an upload is refused for its file's documented limit (the framing allowance is the guard's own)
            return problem(413, f"an attachment is at most {size_text(self.config.upload_max_bytes)}" if upload
                           else f"body larger than {size_text(limit)}")
        return None


def _limited(receive: Receive, limit: int) -> Receive:
    seen = 0

    async def wrapped() -> Message:
        nonlocal seen
        message = await receive()
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > limit:
                raise BodyTooLarge()
        return message

    return wrapped


class BodyTooLarge(Exception):
    pass


def size_text(n: int) -> str:
    """A size in the units the limits are documented in (10 MiB, 256 KiB), as the page says them too."""
    for unit, scale in (("MiB", 1024 * 1024), ("KiB", 1024)):
        if n >= scale:
            return f"{n / scale:.1f}".removesuffix(".0") + f" {unit}"
    return f"{n} bytes"


def _redirect_to(location: str) -> ASGIApp:
    async def redirect(scope: Scope, receive: Receive, send: Send) -> None:
        await _redirect(send, location)

    return redirect


async def _redirect(send: Send, location: str) -> None:
    await send({"type": "http.response.start", "status": 303,
                "headers": [(b"location", location.encode()), (b"content-length", b"0")]})
    await send({"type": "http.response.body", "body": b""})


def parse_login(body: bytes, content_type: str) -> str:
    if content_type.startswith("application/json"):
        try:
            data: Any = json.loads(body or b"{}")
        except (ValueError, RecursionError):  # RecursionError: absurdly deep nesting
            return ""
        return str(data.get("token", "")) if isinstance(data, dict) else ""
    from urllib.parse import parse_qs

    return (parse_qs(body.decode("latin-1")).get("token") or [""])[0]
