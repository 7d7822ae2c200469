"""The ingress's outer boundary (ingress/boundary.py) as values and as ASGI middleware driven by hand: the names it
answers to, the origins it takes writes from, the proxies it believes, and the security headers on every answer.
No socket, no database: a request is a scope, an answer the messages sent."""

from __future__ import annotations

import json
from typing import Any

import pytest
from starlette.types import Message, Receive, Scope, Send

from ingress.boundary import SECURITY_HEADERS, BoundaryConfig, BoundaryMiddleware, forwarded, parse_hosts, \
    parse_networks

pytestmark = pytest.mark.unit

SECRET = "a-proxy-secret-long-enough"


def _scope(method: str = "GET", path: str = "/api/info", headers: dict[str, str] | None = None,
           client: str = "127.0.0.1", scheme: str = "http") -> Scope:
    return {"type": "http", "method": method, "path": path, "scheme": scheme, "query_string": b"",
            "client": (client, 50000), "headers": [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]}


class _App:
    """The routes behind the boundary: records whether it was reached, answers 200 with a header of its own."""

    def __init__(self) -> None:
        self.reached = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.reached += 1
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"x-frame-options", b"SAMEORIGIN"), (b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"ok"})


async def _drive(config: BoundaryConfig, scope: Scope) -> tuple[int, dict[bytes, list[bytes]], Any, _App]:
    app = _App()
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    await BoundaryMiddleware(app, config)(scope, receive, send)
    start = sent[0]
    headers: dict[bytes, list[bytes]] = {}
    for k, v in start["headers"]:
        headers.setdefault(k, []).append(v)
    body = b"".join(m.get("body", b"") for m in sent[1:])
    return start["status"], headers, json.loads(body) if start["status"] != 200 else body, app


LOCAL = BoundaryConfig.build("127.0.0.1", 8000, "petal.example.org", "127.0.0.0/8", SECRET)


def test_the_bind_is_answered_by_its_loopback_names_and_its_port_and_a_configured_name_by_any() -> None:
    assert LOCAL.host_allowed("127.0.0.1:8000") and LOCAL.host_allowed("localhost:8000")
    assert LOCAL.host_allowed("[::1]:8000") and LOCAL.host_allowed("LOCALHOST:8000")
    assert not LOCAL.host_allowed("localhost:8001") and not LOCAL.host_allowed("localhost")  # port 80 is not it
    assert LOCAL.host_allowed("petal.example.org") and LOCAL.host_allowed("petal.example.org:8443")
    assert not LOCAL.host_allowed("evil.example.org") and not LOCAL.host_allowed("")
    assert not LOCAL.host_allowed("user@localhost:8000") and not LOCAL.host_allowed("localhost:8000/x")


def test_a_configured_name_with_a_port_is_answered_on_that_port_only() -> None:
    config = BoundaryConfig.build("127.0.0.1", 8000, "petal.lan:8443", "", None)
    assert config.host_allowed("petal.lan:8443") and not config.host_allowed("petal.lan:443")
    assert not config.host_allowed("petal.lan")  # no port: the scheme's, 80 or 443


def test_a_bind_on_every_address_answers_any_ip_on_its_port_but_no_name() -> None:
    config = BoundaryConfig.build("0.0.0.0", 8000, "", "", None)
    assert config.any_ip_port == 8000
    assert config.host_allowed("192.168.1.20:8000") and config.host_allowed("[fd00::1]:8000")
    assert not config.host_allowed("192.168.1.20:9000") and not config.host_allowed("attacker.example:8000")
    # an origin is a site: an IP reached on the port is not one to take writes from
    assert not config.origin_allowed("http://192.168.1.20:8000")


def test_a_bind_on_one_address_or_name_adds_it() -> None:
    assert BoundaryConfig.build("100.64.0.7", 8000, "", "", None).host_allowed("100.64.0.7:8000")
    assert BoundaryConfig.build("::1", 8000, "", "", None).host_allowed("[::1]:8000")
    assert BoundaryConfig.build("myhost", 8000, "", "", None).host_allowed("myhost:8000")


@pytest.mark.parametrize(("origin", "allowed"), [
    ("http://localhost:8000", True), ("https://petal.example.org", True), ("http://petal.example.org", True),
    ("https://evil.example.org", False), ("null", False), ("file:///x", False), ("http://localhost:9999", False),
    ("javascript:alert(1)", False),
])
def test_a_write_is_taken_from_the_servers_own_origins_only(origin: str, allowed: bool) -> None:
    assert LOCAL.origin_allowed(origin) is allowed


def test_the_requests_own_host_is_same_origin() -> None:
    config = BoundaryConfig.build("0.0.0.0", 8000, "", "", None)
    assert config.origin_allowed("http://192.168.1.20:8000", "192.168.1.20:8000")
    assert not config.origin_allowed("http://192.168.1.20:8000", "192.168.1.21:8000")


def test_a_proxy_is_trusted_by_its_address_and_believed_only_with_the_secret() -> None:
    config = BoundaryConfig.build("127.0.0.1", 8000, "", "10.0.0.0/24, ::1", SECRET)
    assert config.trusts("10.0.0.9") and config.trusts("::1") and config.trusts("[::1]")
    assert not config.trusts("10.0.1.9") and not config.trusts(None) and not config.trusts("not-an-ip")
    assert config.from_proxy(_scope(client="10.0.0.9", headers={"X-Petal-Proxy-Secret": SECRET}))
    assert not config.from_proxy(_scope(client="10.0.0.9", headers={"X-Petal-Proxy-Secret": SECRET + "x"}))
    assert not config.from_proxy(_scope(client="10.0.0.9"))
    assert not config.from_proxy(_scope(client="10.9.9.9", headers={"X-Petal-Proxy-Secret": SECRET}))
    assert BoundaryConfig.build("127.0.0.1", 8000, "", "127.0.0.0/8", None).secret_matches(_scope())


def test_forwarded_headers_count_only_from_the_proxy_and_the_client_is_the_hop_it_saw() -> None:
    headers = {"X-Forwarded-Proto": "https", "X-Forwarded-For": "6.6.6.6, 203.0.113.9"}
    via_proxy = _scope(client="127.0.0.1", headers={**headers, "X-Petal-Proxy-Secret": SECRET})
    assert forwarded(LOCAL, via_proxy) == ("https", "203.0.113.9")
    assert forwarded(LOCAL, _scope(client="127.0.0.1", headers=headers)) == ("http", "127.0.0.1")  # no secret
    odd = _scope(client="127.0.0.1", headers={"X-Forwarded-Proto": "gopher", "X-Petal-Proxy-Secret": SECRET})
    assert forwarded(LOCAL, odd) == ("http", "127.0.0.1")
    assert forwarded(LOCAL, {"type": "http", "headers": []}) == ("http", "unknown")


def test_host_and_network_lists_are_read_or_refused_naming_the_setting() -> None:
    assert parse_hosts(" a.org , b.org:8443,, ") == frozenset({("a.org", None), ("b.org", 8443)})
    assert parse_hosts("[::1]:9") == frozenset({("[::1]", 9)})
    with pytest.raises(ValueError, match="PETAL_ALLOWED_HOSTS: 'a.org:99999'"):
        parse_hosts("a.org:99999")
    assert [str(n) for n in parse_networks("10.0.0.1, [::1], 192.168.0.0/16")] == ["10.0.0.1/32", "::1/128",
                                                                                   "192.168.0.0/16"]
    with pytest.raises(ValueError, match="PETAL_TRUSTED_PROXIES: 'ten'"):
        parse_networks("ten")


def test_the_proxy_secret_never_shows_in_the_configs_repr() -> None:
    assert SECRET not in repr(LOCAL) and LOCAL.proxy_secret == SECRET.encode()


async def test_a_foreign_host_is_answered_421_before_any_route_with_the_security_headers() -> None:
    status, headers, body, app = await _drive(LOCAL, _scope(headers={"Host": "rebound.attacker.example"}))
    assert status == 421 and app.reached == 0
    assert "rebound.attacker.example" in body["detail"] and "PETAL_ALLOWED_HOSTS" in body["detail"]
    assert all(name in headers for name, _ in SECURITY_HEADERS)
    status, _, _, app = await _drive(LOCAL, _scope())  # no Host at all
    assert status == 421 and app.reached == 0


async def test_a_cross_origin_write_is_refused_and_a_read_or_a_script_without_origin_is_not() -> None:
    host = {"Host": "localhost:8000"}
    status, _, body, app = await _drive(LOCAL, _scope("POST", headers={**host, "Origin": "https://evil.example"}))
    assert status == 403 and app.reached == 0 and "cross-origin" in body["detail"]
    status, _, _, app = await _drive(LOCAL, _scope("POST", headers={**host, "Referer": "https://evil.example/x"}))
    assert status == 403 and app.reached == 0  # the Referer when there is no Origin
    for scope in (_scope("GET", headers={**host, "Origin": "https://evil.example"}), _scope("POST", headers=host),
                  _scope("DELETE", headers={**host, "Origin": "http://localhost:8000"})):
        status, _, _, app = await _drive(LOCAL, scope)
        assert status == 200 and app.reached == 1


async def test_a_routes_own_security_header_is_kept_and_the_missing_ones_are_added_once() -> None:
    status, headers, _, _ = await _drive(LOCAL, _scope(headers={"Host": "localhost:8000"}))
    assert status == 200
    assert headers[b"x-frame-options"] == [b"SAMEORIGIN"]  # the route's own, not doubled
    assert len(headers[b"content-security-policy"]) == 1 and headers[b"x-content-type-options"] == [b"nosniff"]


async def test_what_is_not_http_passes_through_untouched() -> None:
    app = _App()
    seen: list[Message] = []

    async def receive() -> Message:
        return {"type": "lifespan.startup"}

    async def send(message: Message) -> None:
        seen.append(message)

    await BoundaryMiddleware(app, LOCAL)({"type": "lifespan"}, receive, send)
    assert app.reached == 1 and seen[0]["headers"] == [(b"x-frame-options", b"SAMEORIGIN"),
                                                       (b"content-type", b"text/plain")]
