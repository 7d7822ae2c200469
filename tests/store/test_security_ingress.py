"""The ingress's boundary over real HTTP (hypercorn on loopback, a real PostgreSQL): Host and Origin in
every mode, proxy trust, token-mode cookies and limits, and push endpoints that would reach inside."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from executor.notify.notes import Note
from executor.notify.notifier import Notifier, NotifyConfig
from ingress.app import OPS
from ingress.auth import FailureLimiter
from ingress.boundary import BoundaryConfig
from shared.database import Database
from tests import tables
from tests.pg import DB
from tests.push_standin import StandIn, Subscriber
from tests.served import ingress_server

FOREIGN = {"Host": "attacker.example"}
SECRET = "proxy-s3cret-proxy-s3cret"
USER = {"X-Authentik-Username": "travis", "X-Petal-Proxy-Secret": SECRET}  # the proxy adds both
ID = str(uuid.uuid4())


def _counts(db: DB) -> dict[str, int]:
    """Rows in every table: "nothing written" means this does not change."""
    with psycopg.connect(db.admin_dsn) as conn:
        names = [r[0] for r in conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY 1").fetchall()]
        return {t: tables.count(conn, t) for t in names}


def _routes() -> list[tuple[str, str, Any]]:
    """Every route the app serves, with a plausible body for the writes."""
    out: list[tuple[str, str, Any]] = []
    for op, _ in OPS:
        path = op.path
        for name in ("task_id", "thread_id", "ask_id", "project_id"):
            path = path.replace("{" + name + "}", ID)
        body = {"text": "run rm -rf /", "thread_id": None} if op.path == "/api/chat" else {}
        out.append((op.method.upper(), path, body if op.method != "get" else None))
    out += [("GET", p, None) for p in ("/", "/index.html", "/app.js", "/sw.js", "/healthz", "/readyz",
                                       "/openapi.json", "/login")]
    out.append(("POST", "/login", None))
    return out


async def _send(http: httpx.AsyncClient, method: str, path: str, body: Any, headers: dict[str, str]) -> httpx.Response:
    if path == "/api/stream":
        async with http.stream(method, path, headers=headers, timeout=10) as r:
            await r.aread()  # a refused stream ends at once; an accepted one would hang here (timeout)
            return r
    return await http.request(method, path, json=body, headers=headers)


@pytest.mark.parametrize("mode", [{}, {"open_mode": False, "proxy_secret": SECRET}, {"open_mode": False, "auth_mode": "token",
                                                             "auth_token": "s3cret-s3cret-s3cret"}])
async def test_every_route_and_the_stream_refuse_a_foreign_host_in_every_mode_and_write_nothing(
    db: DB, mode: dict[str, Any]
) -> None:
    creds = {**USER, "Authorization": "Bearer s3cret-s3cret-s3cret"}
    before = _counts(db)
    async with ingress_server(db.ingress_dsn, **mode) as url, httpx.AsyncClient(base_url=url) as http:
        answers = {(m, p): await _send(http, m, p, b, {**FOREIGN, **creds}) for m, p, b in _routes()}
        rebound = await _send(http, "GET", "/api/stream", None, {"Host": f"attacker.example:{url.rsplit(':', 1)[1]}"})
        own = await http.get("/api/info", headers=creds)
    assert {k: r.status_code for k, r in answers.items() if r.status_code != 421} == {}
    assert all(r.headers["content-type"] == "application/problem+json" for r in answers.values())
    assert rebound.status_code == 421  # the attacker's name rebound to 127.0.0.1 with our port
    assert own.status_code == 200
    assert _counts(db) == before


async def test_a_cross_origin_write_is_refused_and_a_same_origin_write_works(db: DB) -> None:
    async with ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http:
        writes = [(m, p, b) for m, p, b in _routes() if m in ("POST", "PATCH", "DELETE")]
        before = _counts(db)
        refused = {}
        for source in ({"Origin": "http://attacker.example"}, {"Origin": "null"},
                       {"Origin": "http://127.0.0.1:1"},  # another port is another origin
                       {"Referer": "https://attacker.example/page"}):
            for m, p, b in writes:
                refused[(m, p, str(source))] = (await _send(http, m, p, b, source)).status_code
        after_refused = _counts(db)
        same = await http.post("/api/chat", json={"text": "hello"}, headers={"Origin": url})
        by_referer = await http.post("/api/chat", json={"text": "again"}, headers={"Referer": f"{url}/#chat"})
        localhost = await http.post("/api/threads", json={}, headers={
            "Origin": url.replace("127.0.0.1", "localhost"), "Host": url.removeprefix("http://").replace("127.0.0.1", "localhost")})
        reads = await http.get("/api/threads", headers={"Origin": "http://attacker.example"})
    assert {k: s for k, s in refused.items() if s != 403} == {}
    assert after_refused == before
    assert same.status_code == 202 and by_referer.status_code == 202 and localhost.status_code == 202
    # a read needs no Origin check: the browser withholds a cross-origin answer (no CORS headers)
    assert reads.status_code == 200 and "access-control-allow-origin" not in reads.headers


async def test_a_name_in_petal_allowed_hosts_is_answered_with_any_port_or_the_one_given(db: DB) -> None:
    async with ingress_server(db.ingress_dsn, allowed_hosts="petal.example.com, tail.example:8443") as url, \
            httpx.AsyncClient(base_url=url) as http:
        public = await http.post("/api/chat", json={"text": "via the proxy"}, headers={
            "Host": "petal.example.com", "Origin": "https://petal.example.com"})
        tail = await http.get("/api/info", headers={"Host": "tail.example:8443"})
        wrong_port = await http.get("/api/info", headers={"Host": "tail.example:9000"})
    assert public.status_code == 202 and tail.status_code == 200 and wrong_port.status_code == 421


def test_the_allowed_names_are_the_binds_loopback_names_and_address_and_bad_settings_are_refused() -> None:
    config = BoundaryConfig.build("100.64.1.2", 8000, "", "127.0.0.0/8,::1")
    assert all(config.host_allowed(h) for h in ("127.0.0.1:8000", "localhost:8000", "[::1]:8000", "100.64.1.2:8000",
                                                 "LOCALHOST:8000"))
    assert not any(config.host_allowed(h) for h in ("127.0.0.1:8001", "localhost", "evil.localhost:8000",
                                                     "127.0.0.1:8000@evil", "", "a b:8000"))
    assert config.trusts("127.0.0.5") and config.trusts("::1") and not config.trusts("100.64.1.2")
    anywhere = BoundaryConfig.build("0.0.0.0", 8000, "", "")
    assert anywhere.host_allowed("0.0.0.0:8000") and anywhere.host_allowed("192.168.1.20:8000")
    assert anywhere.host_allowed("[fd00::1]:8000")
    # a write from the address it was reached by is same-origin; from another address, not
    assert anywhere.origin_allowed("http://192.168.1.20:8000", "192.168.1.20:8000")
    assert not anywhere.origin_allowed("http://192.168.1.99:8000", "192.168.1.20:8000")
    assert not anywhere.host_allowed("192.168.1.20:9000") and not anywhere.host_allowed("attacker.example:8000")
    with pytest.raises(ValueError, match="PETAL_ALLOWED_HOSTS"):
        BoundaryConfig.build("127.0.0.1", 8000, "http://x/", "")
    with pytest.raises(ValueError, match="PETAL_TRUSTED_PROXIES"):
        BoundaryConfig.build("127.0.0.1", 8000, "", "10.0.0.0/33")


# ---- proxy trust ---------------------------------------------------------------------------------------

async def test_the_proxy_header_counts_only_from_a_trusted_proxy(db: DB) -> None:
    async with ingress_server(db.ingress_dsn, open_mode=False, trusted_proxies="10.9.9.9", proxy_secret=SECRET) as url, \
            httpx.AsyncClient(base_url=url) as http:
        forged = await http.get("/api/threads", headers=USER)
        forged_stream = await _send(http, "GET", "/api/stream", None, USER)
        forged_write = await http.post("/api/chat", json={"text": "x"}, headers=USER)
        health = await http.get("/healthz")
    async with ingress_server(db.ingress_dsn, open_mode=False, trusted_proxies="127.0.0.1", proxy_secret=SECRET) as url, \
            httpx.AsyncClient(base_url=url) as http:
        trusted = await http.get("/api/threads", headers=USER)
    assert forged.status_code == 401 and "PETAL_TRUSTED_PROXIES" in forged.json()["detail"]
    assert forged_stream.status_code == 401 and forged_write.status_code == 401
    assert health.status_code == 200
    assert trusted.status_code == 200


# ---- token mode ----------------------------------------------------------------------------------------

TOKEN = {"open_mode": False, "auth_mode": "token", "auth_token": "s3cret-s3cret-s3cret"}


async def test_the_login_cookie_is_httponly_strict_and_secure_only_behind_a_trusted_https_proxy(db: DB) -> None:
    https = {"X-Forwarded-Proto": "https"}
    async with ingress_server(db.ingress_dsn, **TOKEN) as url, httpx.AsyncClient(base_url=url) as http:
        plain = await http.post("/login", data={"token": "s3cret-s3cret-s3cret"})
        behind = await http.post("/login", data={"token": "s3cret-s3cret-s3cret"}, headers=https)
        unicode = await http.post("/login", json={"token": "sécret"})
    async with ingress_server(db.ingress_dsn, trusted_proxies="10.9.9.9", **TOKEN) as url, \
            httpx.AsyncClient(base_url=url) as http:
        spoofed = await http.post("/login", data={"token": "s3cret-s3cret-s3cret"}, headers=https)
    for r in (plain, behind, spoofed):
        assert r.status_code == 303
        flags = {f.strip().lower() for f in r.headers["set-cookie"].split(";")}
        assert {"httponly", "samesite=strict"} <= flags
    assert "secure" in behind.headers["set-cookie"].lower()
    assert "secure" not in plain.headers["set-cookie"].lower()
    assert "secure" not in spoofed.headers["set-cookie"].lower()  # X-Forwarded-Proto from an untrusted peer
    assert unicode.status_code == 401  # not a 500 from comparing non-ASCII text


async def test_the_eleventh_wrong_token_in_a_minute_gets_429_and_other_clients_are_not_held_back(db: DB) -> None:
    async with ingress_server(db.ingress_dsn, **TOKEN) as url, httpx.AsyncClient(base_url=url) as http:
        wrong = [(await http.post("/login", data={"token": f"guess{i}"})).status_code for i in range(11)]
        right_but_late = await http.post("/login", data={"token": "s3cret-s3cret-s3cret"})
        bearer = await http.get("/api/threads", headers={"Authorization": "Bearer s3cret-s3cret-s3cret"})
        # behind the (trusted, loopback) proxy each user is the address it forwards
        other = await http.post("/login", data={"token": "s3cret-s3cret-s3cret"}, headers={"X-Forwarded-For": "203.0.113.7"})
    assert wrong == [401] * 10 + [429]
    assert right_but_late.status_code == 429 and int(right_but_late.headers["retry-after"]) > 0
    assert "Too many wrong tokens: try again in" in right_but_late.text  # the form again, saying how long
    assert bearer.status_code == 429
    assert other.status_code == 303


def test_the_failure_window_slides_a_client_may_try_again_once_its_oldest_failure_is_a_minute_old() -> None:
    limiter = FailureLimiter(limit=10, window_s=60)
    for i in range(10):
        assert limiter.retry_after("a", now=100 + i) == 0
        limiter.fail("a", now=100 + i)
    assert limiter.retry_after("a", now=110) == 50 and limiter.retry_after("b", now=110) == 0
    assert limiter.retry_after("a", now=159.5) == 0.5
    assert limiter.retry_after("a", now=160) == 0  # the oldest failure has aged out: one more try
    limiter.fail("a", now=160)
    assert limiter.retry_after("a", now=160) == 1  # ten in the window again, the oldest from 101


async def test_wrong_bearer_tokens_are_limited_too(db: DB) -> None:
    async with ingress_server(db.ingress_dsn, **TOKEN) as url, httpx.AsyncClient(base_url=url) as http:
        got = [(await http.get("/api/threads", headers={"Authorization": f"Bearer g{i}"})).status_code for i in range(11)]
    assert got == [401] * 10 + [429]


async def test_an_oversized_chunked_login_body_is_413_not_500(db: DB) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(8):
            yield b"token=" + b"x" * 1024

    async with ingress_server(db.ingress_dsn, max_body_bytes=2048, **TOKEN) as url, \
            httpx.AsyncClient(base_url=url) as http:
        login = await http.post("/login", content=chunks(), headers={"Content-Type": "application/x-www-form-urlencoded"})
        chat = await http.post("/api/chat", content=chunks(), headers={"Content-Type": "application/json",
                                                                        "Authorization": "Bearer s3cret-s3cret-s3cret"})
        alive = await http.post("/login", data={"token": "s3cret-s3cret-s3cret"})
    assert login.status_code == 413 and login.headers["content-type"] == "application/problem+json"
    assert login.request.headers["transfer-encoding"] == "chunked"
    assert chat.status_code == 413
    assert alive.status_code == 303


@pytest.mark.parametrize(("path", "kind", "mode"), [("/api/chat", "application/json", {}),
                                                    ("/login", "application/x-www-form-urlencoded", TOKEN)])
async def test_a_client_gone_before_its_body_arrived_is_no_error_and_writes_nothing(
    db: DB, caplog: pytest.LogCaptureFixture, path: str, kind: str, mode: dict[str, Any]
) -> None:
    """A phone that drops off mid-POST: nothing queued, no traceback in the ingress's log, the next request served."""
    async with ingress_server(db.ingress_dsn, **mode) as url, httpx.AsyncClient(base_url=url) as http:
        host, port = url.removeprefix("http://").split(":")
        for _ in range(2):
            _, writer = await asyncio.open_connection(host, int(port))
            writer.write(f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: {kind}\r\n"
                         f"Content-Length: 1000\r\n\r\ntext=half a mess".encode())
            await writer.drain()
            await asyncio.sleep(0.2)  # not a wait: the phone's pause mid-body before it drops off
            writer.close()
        await asyncio.sleep(0.5)  # a window in which the dropped requests would queue or log an error (they must not)
        after = await http.get("/healthz")
    assert after.status_code == 200
    with psycopg.connect(db.admin_dsn) as conn:
        assert tables.count(conn, "chat_queue") == 0
    noisy = [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
    assert not noisy, [r.getMessage() for r in noisy]


# ---- headers -------------------------------------------------------------------------------------------

async def test_the_page_and_the_api_carry_the_security_headers(db: DB) -> None:
    async with ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http:
        page, api, refused = await http.get("/"), await http.get("/api/info"), await http.get("/", headers=FOREIGN)
    for r in (page, api, refused):
        csp = {d.strip().split(" ")[0]: d.strip() for d in r.headers["content-security-policy"].split(";")}
        assert csp["default-src"] == "default-src 'self'" and csp["script-src"] == "script-src 'self'"
        assert csp["frame-ancestors"] == "frame-ancestors 'none'" and csp["object-src"] == "object-src 'none'"
        assert r.headers["x-content-type-options"] == "nosniff" and r.headers["referrer-policy"] == "same-origin"
    assert "<script>" not in page.text and " style=" not in page.text  # nothing the CSP would block


# ---- push endpoints ------------------------------------------------------------------------------------

INSIDE = ["https://10.0.0.1/push/x", "https://192.168.1.5/push/x", "https://169.254.169.254/latest/meta-data",
          "https://[::1]/push/x", "http://127.0.0.1:9/push/x", "https://localhost/push/x", "https://100.64.0.1/x",
          "https://[::ffff:10.0.0.1]/x", "https://0.0.0.0/x"]


async def test_push_endpoints_inside_this_machine_or_network_are_refused(db: DB) -> None:
    keys = Subscriber("https://push.example/x").json()["keys"]
    async with ingress_server(db.ingress_dsn) as url, httpx.AsyncClient(base_url=url) as http:
        answers = {e: await http.post("/api/push/subscriptions", json={"endpoint": e, "keys": keys}) for e in INSIDE}
    async with ingress_server(db.ingress_dsn, push_allow_loopback=True) as url, httpx.AsyncClient(base_url=url) as http:
        # the test-only setting lets loopback through (409: no executor has published a key), nothing else
        loopback = await http.post("/api/push/subscriptions", json={"endpoint": "https://[::1]/x", "keys": keys})
        private = await http.post("/api/push/subscriptions", json={"endpoint": "https://10.0.0.1/x", "keys": keys})
    assert {e: r.status_code for e, r in answers.items() if r.status_code != 422} == {}
    assert "public" in answers[INSIDE[2]].json()["detail"]
    assert loopback.status_code == 409 and private.status_code == 422
    with psycopg.connect(db.admin_dsn) as conn:
        assert tables.count(conn, "push_subscriptions") == 0


async def test_the_executor_rechecks_a_stored_endpoint_and_sends_nothing_inside(db: DB, tmp_path: Path) -> None:
    with StandIn() as push:
        phone = Subscriber(f"{push.url}/push/stored")
        # a row that got in some other way
        tables.insert(db.admin_dsn, "push_subscriptions", endpoint=phone.endpoint, p256dh=phone.p256dh,
                      auth=phone.json()["keys"]["auth"])
        async with Database(db.executor_dsn, name="test-notifier") as database:
            note = Note("test", "t", "b", "/")
            results = []
            for allow in (False, True):
                notifier = Notifier(database.pool, NotifyConfig(data_dir=tmp_path / "var", allow_loopback_push=allow))
                await notifier.start()
                results.append(await notifier.deliver([note]))
        received = len(push.received)
    refused, allowed = results
    assert refused == ("failed", {"push": ["refused"], "ntfy": None})
    assert allowed[0] == "sent" and received == 1  # the same row, allowed: the stand-in got exactly one

