"""Who gets in and with what body (ingress/auth.py), as values and as ASGI middleware driven by hand: the three auth
modes, the token's limiter on an injected clock, and the guard's refusals before any route runs."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import SecretStr
from starlette.types import Message, Receive, Scope, Send

from ingress import auth
from ingress.auth import AuthConfig, FailureLimiter, GuardMiddleware, TokenLimiter, identify, same_secret
from ingress.boundary import BoundaryConfig

pytestmark = pytest.mark.unit

TOKEN = "a-token-of-enough-characters"
SECRET = "a-proxy-secret-long-enough"
TOKEN_MODE = AuthConfig(mode="token", token=SecretStr(TOKEN), max_body_bytes=2048, upload_max_bytes=4096)
BOUNDARY = BoundaryConfig.build("127.0.0.1", 8000, "", "127.0.0.0/8", None)


def _h(**headers: str) -> dict[bytes, bytes]:
    return {k.replace("_", "-").lower().encode(): v.encode() for k, v in headers.items()}


# ---- identify ----------------------------------------------------------------------------------------------

def test_open_mode_lets_anyone_in() -> None:
    assert identify(AuthConfig(mode="open"), {}) == (0, "open")


def test_proxy_mode_takes_the_user_the_proxy_names_within_its_allow_list() -> None:
    proxy = AuthConfig(mode="proxy", allowed_users=frozenset({"ann"}))
    assert identify(proxy, _h(x_authentik_username=" ann ")) == (0, "ann")
    status, reason = identify(proxy, _h(x_authentik_username="bob"))
    assert status == 403 and "'bob' is not on the allow-list" in reason
    assert identify(proxy, {})[0] == 401 and identify(proxy, _h(x_authentik_username="  "))[0] == 401
    assert identify(AuthConfig(mode="proxy"), _h(x_authentik_username="anyone")) == (0, "anyone")


def test_token_mode_takes_the_bearer_token_or_the_cookie_made_from_it() -> None:
    assert identify(TOKEN_MODE, _h(authorization=f"Bearer {TOKEN}")) == (0, "token")
    assert identify(TOKEN_MODE, _h(authorization=f"bearer   {TOKEN} ")) == (0, "token")
    assert identify(TOKEN_MODE, _h(authorization="Bearer wrong")) == (401, "wrong token")
    cookie = f"theme=dark; {auth.COOKIE}={TOKEN_MODE.cookie_value()}"
    assert identify(TOKEN_MODE, _h(cookie=cookie)) == (0, "token")
    assert identify(TOKEN_MODE, _h(cookie=f"{auth.COOKIE}={TOKEN}"))[0] == 401  # the token itself is no cookie
    assert identify(TOKEN_MODE, _h(cookie="x=1"))[0] == 401 and identify(TOKEN_MODE, {})[0] == 401


def test_the_cookie_is_a_mac_of_the_token_never_the_token_and_changes_with_it() -> None:
    value = TOKEN_MODE.cookie_value()
    assert TOKEN not in value and len(value) == 64
    assert value != AuthConfig(mode="token", token=SecretStr(TOKEN + "2")).cookie_value()


def test_secrets_compare_whatever_their_characters_and_none_matches_nothing() -> None:
    assert same_secret("é-ü", "é-ü") and same_secret(TOKEN, SecretStr(TOKEN))
    assert not same_secret("é-ü", "e-u") and not same_secret("", None) and not same_secret(TOKEN, TOKEN + " ")
    assert not same_secret("\udcff", "x")  # a lone surrogate from a header: compared, not a 500


# ---- the limiter ---------------------------------------------------------------------------------------------

def test_a_client_is_held_back_after_its_limit_until_its_oldest_failure_leaves_the_window() -> None:
    limiter = FailureLimiter(limit=3, window_s=60)
    for at in (0.0, 10.0, 20.0):
        assert limiter.retry_after("c", at) == 0.0
        limiter.fail("c", at)
    assert limiter.retry_after("c", 30.0) == pytest.approx(30.0)  # the first failure leaves at 60
    assert limiter.retry_after("other", 30.0) == 0.0
    assert limiter.retry_after("c", 60.0) == 0.0  # slid: two failures left in the window


def test_only_the_last_failures_up_to_the_limit_are_kept_per_client(monkeypatch: pytest.MonkeyPatch) -> None:
    limiter = FailureLimiter(limit=2, window_s=60)
    for at in (0.0, 50.0, 55.0):
        limiter.fail("c", at)
    assert limiter.retry_after("c", 56.0) == pytest.approx(54.0)  # from the failure at 50 (at 0 it would be 4)
    monkeypatch.setattr(auth, "_LIMITER_CLIENTS", 2)
    for client in ("a", "b"):
        limiter.fail(client, 56.0)
        limiter.fail(client, 56.0)
    assert limiter.retry_after("c", 57.0) == 0.0  # the least recently failing client is forgotten first
    assert limiter.retry_after("b", 57.0) > 0


def test_wrong_tokens_are_counted_per_peer_too_whatever_client_it_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(auth, "PEER_FAILURES_PER_WINDOW", 3)
    limiter = TokenLimiter()
    for i in range(3):
        limiter.fail(f"client-{i}", "127.0.0.1")
    assert limiter.retry_after("client-new", "127.0.0.1") > 0
    assert limiter.retry_after("client-new", "10.0.0.1") == 0.0


@pytest.mark.parametrize(("n", "text"), [(10 * 1024 * 1024, "10 MiB"), (256 * 1024, "256 KiB"), (1536, "1.5 KiB"),
                                         (1023, "1023 bytes"), (3 * 1024 * 1024 + 1, "3 MiB")])
def test_a_size_is_said_in_the_units_the_limits_are_documented_in(n: int, text: str) -> None:
    assert auth.size_text(n) == text


@pytest.mark.parametrize(("body", "ctype", "token"), [
    (b'{"token": "abc"}', "application/json", "abc"), (b'{"token": 12}', "application/json; charset=utf-8", "12"),
    (b"[1]", "application/json", ""), (b"{bad", "application/json", ""), (b"[" * 5000, "application/json", ""),
    (b"token=a%2Bb&x=1", "application/x-www-form-urlencoded", "a+b"), (b"", "application/x-www-form-urlencoded", ""),
])
def test_the_sign_in_reads_the_token_from_json_or_a_form_and_nothing_else(body: bytes, ctype: str, token: str) -> None:
    assert auth.parse_login(body, ctype) == token


# ---- the guard as middleware ---------------------------------------------------------------------------------

class _App:
    def __init__(self) -> None:
        self.scopes: list[Scope] = []
        self.body = b""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.scopes.append(scope)
        while True:
            message = await receive()
            self.body += message.get("body", b"")
            if not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


def _scope(method: str, path: str, headers: dict[str, str], client: str = "127.0.0.1", query: bytes = b"") -> Scope:
    return {"type": "http", "method": method, "path": path, "query_string": query, "scheme": "http",
            "client": (client, 4000), "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()]}


async def _guard(config: AuthConfig, scope: Scope, chunks: tuple[bytes, ...] = (b"",), *,
                 boundary: BoundaryConfig = BOUNDARY, limiter: TokenLimiter | None = None) -> tuple[int, Any, _App]:
    app = _App()
    pending = list(chunks)
    sent: list[Message] = []

    async def receive() -> Message:
        body = pending.pop(0) if pending else b""
        return {"type": "http.request", "body": body, "more_body": bool(pending)}

    async def send(message: Message) -> None:
        sent.append(message)

    await GuardMiddleware(app, config, boundary, limiter or TokenLimiter())(scope, receive, send)
    status = sent[0]["status"]
    raw = b"".join(m.get("body", b"") for m in sent[1:])
    detail: Any = json.loads(raw) if status not in (200, 303) else dict(sent[0]["headers"])
    return status, detail, app


BEARER = {"authorization": f"Bearer {TOKEN}"}
JSON = {**BEARER, "content-type": "application/json"}


async def test_a_nul_in_the_url_is_refused_before_anything_else() -> None:
    for scope in (_scope("GET", "/api/x\x00y", BEARER), _scope("GET", "/api/x", BEARER, query=b"a=%00")):
        status, body, app = await _guard(TOKEN_MODE, scope)
        assert status == 400 and "NUL" in body["detail"] and app.scopes == []


async def test_the_public_paths_need_no_credential_and_the_rest_do() -> None:
    for path in sorted(auth.PUBLIC_PATHS):
        assert (await _guard(TOKEN_MODE, _scope("GET", path, {})))[0] == 200, path
    status, body, app = await _guard(TOKEN_MODE, _scope("GET", "/api/threads", {}))
    assert status == 401 and app.scopes == []


async def test_a_signed_in_request_reaches_the_route_with_its_user() -> None:
    status, _, app = await _guard(TOKEN_MODE, _scope("GET", "/api/threads", BEARER))
    assert status == 200 and app.scopes[0]["state"]["user"] == "token"


async def test_a_page_without_credentials_is_sent_to_the_sign_in_and_the_api_gets_a_problem() -> None:
    status, headers, _ = await _guard(TOKEN_MODE, _scope("GET", "/threads/1", {}))
    assert status == 303 and headers[b"location"] == b"/login"
    assert (await _guard(TOKEN_MODE, _scope("GET", "/api/threads", {})))[0] == 401


async def test_proxy_mode_believes_the_identity_header_only_from_a_trusted_peer_with_the_secret() -> None:
    proxy = AuthConfig(mode="proxy")
    boundary = BoundaryConfig.build("127.0.0.1", 8000, "", "127.0.0.0/8", SECRET)
    named = {"x-authentik-username": "ann"}
    with_secret = {**named, "x-petal-proxy-secret": SECRET}
    status, _, app = await _guard(proxy, _scope("GET", "/api/x", with_secret), boundary=boundary)
    assert status == 200 and app.scopes[0]["state"]["user"] == "ann"
    status, body, _ = await _guard(proxy, _scope("GET", "/api/x", named), boundary=boundary)
    assert status == 401 and "proxy secret" in body["detail"]
    status, body, _ = await _guard(proxy, _scope("GET", "/api/x", with_secret, client="10.1.1.1"), boundary=boundary)
    assert status == 401 and "10.1.1.1 is not a trusted proxy" in body["detail"]


async def test_a_state_change_takes_json_and_an_upload_takes_a_form() -> None:
    status, body, _ = await _guard(TOKEN_MODE, _scope("POST", "/api/chat", {**BEARER, "content-type": "text/plain"}))
    assert status == 415 and "application/json" in body["detail"]
    assert (await _guard(TOKEN_MODE, _scope("POST", "/api/chat", BEARER)))[0] == 415  # a POST without a type too
    assert (await _guard(TOKEN_MODE, _scope("POST", "/api/chat", JSON)))[0] == 200
    assert (await _guard(TOKEN_MODE, _scope("DELETE", "/api/x", BEARER)))[0] == 200  # no body, no type needed
    form = {**BEARER, "content-type": "multipart/form-data; boundary=x"}
    assert (await _guard(TOKEN_MODE, _scope("POST", auth.UPLOAD_PATH, form)))[0] == 200
    assert (await _guard(TOKEN_MODE, _scope("POST", auth.UPLOAD_PATH, JSON)))[0] == 415


async def test_a_declared_length_over_the_limit_is_refused_with_the_limit_said() -> None:
    status, body, app = await _guard(TOKEN_MODE, _scope("POST", "/api/chat", {**JSON, "content-length": "2049"}))
    assert status == 413 and body["detail"] == "body larger than 2 KiB" and app.scopes == []
    upload = {**BEARER, "content-type": "multipart/form-data", "content-length": str(4096 + 64 * 1024 + 1)}
    status, body, _ = await _guard(TOKEN_MODE, _scope("POST", auth.UPLOAD_PATH, upload))
    assert status == 413 and body["detail"] == "an attachment is at most 4 KiB"
    # a webhook authenticates itself and may be larger than the API's limit
    hook = "/api/hooks/0b7d8f1e-2f55-4f39-9a55-7d1f0c4b7a10"
    status, _, _ = await _guard(TOKEN_MODE, _scope("POST", hook, {"content-type": "application/json",
                                                                  "content-length": "5000"}))
    assert status == 200


async def test_a_body_that_grows_past_the_limit_while_streamed_is_cut_off() -> None:
    with pytest.raises(auth.BodyTooLarge):
        await _guard(TOKEN_MODE, _scope("POST", "/api/chat", {**JSON, "transfer-encoding": "chunked"}),
                     (b"x" * 1500, b"x" * 1500))
    status, _, app = await _guard(TOKEN_MODE, _scope("POST", "/api/chat", JSON), (b"x" * 1000, b"x" * 1000))
    assert status == 200 and len(app.body) == 2000


async def test_the_eleventh_wrong_bearer_token_gets_429_and_the_right_one_is_held_back_too() -> None:
    limiter = TokenLimiter()
    wrong = {"authorization": "Bearer nope"}
    for _ in range(auth.FAILURES_PER_WINDOW):
        assert (await _guard(TOKEN_MODE, _scope("GET", "/api/x", wrong), limiter=limiter))[0] == 401
    status, body, app = await _guard(TOKEN_MODE, _scope("GET", "/api/x", BEARER), limiter=limiter)
    assert status == 429 and "try again in" in body["detail"] and app.scopes == []
    assert (await _guard(TOKEN_MODE, _scope("GET", "/api/x", BEARER, client="127.0.0.2"), limiter=limiter))[0] == 200
