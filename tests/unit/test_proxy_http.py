"""The gateway's plain HTTP requests (executor/sandbox/http1.py): a head read strictly, the Host check, and bodies
forwarded with the framing the proxy decided — what two parsers could read two ways is refused."""

from __future__ import annotations

import asyncio

import pytest

from executor.sandbox import http1
from executor.sandbox.http1 import BadRequest, Forbidden

pytestmark = pytest.mark.unit


def head(*lines: str, target: str = "http://allowed.test/x", method: str = "GET") -> http1.Head:
    return http1.parse_head(f"{method} {target} HTTP/1.1\r\n".encode() + "".join(
        f"{line}\r\n" for line in lines).encode() + b"\r\n")


def test_a_head_is_read_into_its_fields() -> None:
    h = head("Host: allowed.test", "X-A:  spaced \t", target="http://allowed.test:8080/p?q=1")
    assert (h.method, h.target, h.version) == ("GET", "http://allowed.test:8080/p?q=1", "HTTP/1.1")
    assert h.headers == (("Host", "allowed.test"), ("X-A", "spaced"))
    assert http1.origin(h) == ("allowed.test", 8080, "/p?q=1")


@pytest.mark.parametrize("raw, says", [
    (b"GET http://a/ HTTP/1.1\r\nHost: a\nHost: evil\r\n\r\n", "bare CR or LF"),
    (b"GET http://a/ HTTP/1.1\r\nHost: a\rX: b\r\n\r\n", "bare CR or LF"),
    (b"GET http://a/ HTTP/1.1\r\nX: a\r\n evil\r\n\r\n", "malformed header line"),  # obs-fold
    (b"GET http://a/ HTTP/1.1\r\nHost : evil\r\n\r\n", "malformed header line"),
    (b"GET http://a/ HTTP/1.1\r\nHost: a\x00b\r\n\r\n", "control character"),
    (b"GET  http://a/ HTTP/1.1\r\n\r\n", "malformed request line"),
    (b"GET http://a/ HTTP/2.0\r\n\r\n", "malformed request line"),
    (b"GET http://a/ HTTP/1.1\r\n", "must end with"),
])
def test_a_head_two_parsers_could_read_two_ways_is_refused(raw: bytes, says: str) -> None:
    with pytest.raises(BadRequest, match=says):
        http1.parse_head(raw)


@pytest.mark.parametrize("host", ["allowed.test", "ALLOWED.test", "allowed.test:80"])
def test_a_host_naming_the_target_passes(host: str) -> None:
    http1.check_request(head(f"Host: {host}"), "allowed.test", 80)


@pytest.mark.parametrize("lines, says", [
    (["Host: evil.test"], "names evil.test"),
    (["Host: allowed.test:8080"], "names allowed.test:8080"),
    (["Host: allowed.test.evil.test"], "names allowed.test.evil.test"),
    (["Host: allowed.test:"], "names allowed.test:"),
    ([], "without a Host"),
    (["Host: allowed.test", "Upgrade: websocket", "Connection: upgrade"], "protocol upgrade"),
])
def test_a_host_naming_another_site_is_forbidden(lines: list[str], says: str) -> None:
    with pytest.raises(Forbidden, match=says):
        http1.check_request(head(*lines), "allowed.test", 80)


def test_two_host_headers_are_a_bad_request() -> None:
    with pytest.raises(BadRequest, match="2 host headers"):
        http1.check_request(head("Host: allowed.test", "Host: evil.test"), "allowed.test", 80)


@pytest.mark.parametrize("target, says", [
    ("http://allowed.test@evil.test/", "malformed authority"),
    ("https://allowed.test/", "not a proxy request"),
    ("/x", "not a proxy request"),
])
def test_a_target_that_is_no_plain_authority_is_refused(target: str, says: str) -> None:
    with pytest.raises(BadRequest, match=says):
        http1.origin(head("Host: allowed.test", target=target))


def test_the_authority_is_the_one_a_url_parser_finds() -> None:
    assert http1.origin(head(target="http://evil.test#@allowed.test/")) == ("evil.test", 80, "/")
    assert http1.origin(head(target="http://evil.test?@allowed.test/")) == ("evil.test", 80, "/?@allowed.test/")
    assert http1.origin(head(target="http://[::1]:8080")) == ("::1", 8080, "/")


def test_a_later_request_for_another_authority_is_forbidden_on_the_connection() -> None:
    assert http1.origin(head(target="http://allowed.test"), ("allowed.test", 80)) == ("allowed.test", 80, "/")
    with pytest.raises(Forbidden, match="opened for allowed.test:80"):
        http1.origin(head(target="http://allowed.test:81/"), ("allowed.test", 80))


@pytest.mark.parametrize("lines, framed", [
    ([], http1.Framing(False, 0)),
    (["Content-Length: 12"], http1.Framing(False, 12)),
    (["Transfer-Encoding: Chunked"], http1.Framing(True, 0)),
])
def test_a_body_is_framed_one_way(lines: list[str], framed: http1.Framing) -> None:
    assert http1.framing(head(*lines)) == framed


@pytest.mark.parametrize("lines, says", [
    (["Content-Length: 3", "Transfer-Encoding: chunked"], "both"),
    (["Transfer-Encoding: gzip, chunked"], "only chunked"),
    (["Transfer-Encoding: chunked", "Transfer-Encoding: chunked"], "2 transfer-encoding"),
    (["Content-Length: 3", "Content-Length: 4"], "2 content-length"),
    (["Content-Length: -1"], "Content-Length"),
    (["Content-Length: 0x10"], "Content-Length"),
])
def test_an_ambiguous_framing_is_refused(lines: list[str], says: str) -> None:
    with pytest.raises(BadRequest, match=says):
        http1.framing(head(*lines))


async def _copied(data: bytes, how: http1.Framing) -> tuple[bytes, bytes]:
    """What copy_body writes for `data`, and what it leaves unread (the next request's bytes)."""
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    reader.feed_eof()
    out = bytearray()

    async def write(piece: bytes) -> None:
        out.extend(piece)

    await http1.copy_body(reader, write, how)
    return bytes(out), await reader.read()


async def test_a_body_is_copied_to_its_end_and_the_next_request_left_for_its_own_check() -> None:
    nxt = b"GET http://evil.test/ HTTP/1.1\r\n"
    assert await _copied(b"hello" + nxt, http1.Framing(False, 5)) == (b"hello", nxt)
    chunked = b"5;ext=1\r\nhello\r\nA\r\n0123456789\r\n0\r\nX-Trailer: evil\r\n\r\n"
    # re-chunked without extensions or trailers (the server cannot see a header the proxy never checked)
    assert await _copied(chunked + nxt, http1.Framing(True, 0)) == (
        b"5\r\nhello\r\na\r\n0123456789\r\n0\r\n\r\n", nxt)


@pytest.mark.parametrize("body", [b"zz\r\n", b"5\r\nhelloXX", b"\r\n", b"5\nhello\r\n0\r\n\r\n",
                                  b"1" * 20 + b"\r\n"])
async def test_a_malformed_chunk_is_refused(body: bytes) -> None:
    with pytest.raises(BadRequest):
        await _copied(body, http1.Framing(True, 0))


async def test_a_body_cut_short_is_no_request() -> None:
    with pytest.raises(asyncio.IncompleteReadError):
        await _copied(b"hel", http1.Framing(False, 5))


def test_the_forwarded_head_is_the_parsed_one_in_origin_form_without_proxy_headers() -> None:
    h = head("Host: allowed.test", "Proxy-Authorization: Basic x", "Proxy-Connection: keep-alive", "Accept: */*")
    assert http1.serialise(h, "/x", lambda name: name.startswith("proxy-")) == (
        b"GET /x HTTP/1.1\r\nHost: allowed.test\r\nAccept: */*\r\n\r\n")
