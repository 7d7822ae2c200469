"""HTTP/1.1 requests as the gateway's proxy reads them (RFC 9112): a request head parsed strictly, and its body
copied with the framing the proxy itself decided.

What the proxy forwards is what it parsed, written anew — the head from its fields, a chunked body re-chunked
without extensions or trailers — so the server behind it cannot read a message boundary (or a header) the proxy
did not see: anything two parsers could read two ways (a bare CR or LF, a folded line, a space before a colon, both
Content-Length and Transfer-Encoding, a coding other than chunked) is refused instead.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_VALUE = re.compile(rb"[\t\x20-\x7e\x80-\xff]*")
_TARGET = re.compile(rb"[\x21-\x7e]+")
_VERSIONS = (b"HTTP/1.1", b"HTTP/1.0")
# a chunk-size line (with extensions the proxy drops) and a trailer line
LINE_LIMIT = 4096
_PIECE = 1 << 16
_AUTHORITY = re.compile(r"(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+)(?::[0-9]{1,5})?")


class BadRequest(ValueError):
    """A request the proxy will not forward, and why."""


@dataclass(frozen=True)
class Head:
    method: str
    target: str
    version: str
    headers: tuple[tuple[str, str], ...]  # names as sent, values stripped

    def values(self, name: str) -> list[str]:
        return [v for n, v in self.headers if n.lower() == name]

    def one(self, name: str) -> str | None:
        """The value of a header that may appear at most once."""
        found = self.values(name)
        if len(found) > 1:
            raise BadRequest(f"{len(found)} {name} headers")
        return found[0] if found else None


def parse_head(head: bytes) -> Head:
    """A request head ending in CRLF CRLF. Raises BadRequest."""
    if not head.endswith(b"\r\n\r\n"):
        raise BadRequest("a request head must end with CRLF CRLF")
    lines = head[:-4].split(b"\r\n")
    if any(b"\r" in line or b"\n" in line for line in lines):
        raise BadRequest("a bare CR or LF in the request head")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or not _TOKEN.fullmatch(parts[0]) or not _TARGET.fullmatch(parts[1]) \
            or parts[2] not in _VERSIONS:
        raise BadRequest(f"a malformed request line: {lines[0][:200]!r}")
    headers = []
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon or not _TOKEN.fullmatch(name):  # also a folded line, or a space before the colon
            raise BadRequest(f"a malformed header line: {line[:200]!r}")
        value = value.strip(b" \t")
        if not _VALUE.fullmatch(value):
            raise BadRequest(f"a control character in header {name.decode()}")
        headers.append((name.decode(), value.decode("latin-1")))
    return Head(parts[0].decode(), parts[1].decode(), parts[2].decode(), tuple(headers))


@dataclass(frozen=True)
class Framing:
    """How the request's body ends: `chunked`, or `length` bytes (0: no body)."""

    chunked: bool
    length: int


def framing(head: Head) -> Framing:
    coding = head.one("transfer-encoding")
    length = head.one("content-length")
    if coding is not None:
        if coding.lower() != "chunked":
            raise BadRequest(f"Transfer-Encoding {coding[:100]!r} (only chunked is forwarded)")
        if length is not None:
            raise BadRequest("both Content-Length and Transfer-Encoding")
        if head.version == "HTTP/1.0":
            raise BadRequest("Transfer-Encoding in an HTTP/1.0 request")
        return Framing(True, 0)
    if length is None:
        return Framing(False, 0)
    if not length.isdigit() or len(length) > 18:
        raise BadRequest(f"Content-Length {length[:100]!r}")
    return Framing(False, int(length))


def serialise(head: Head, target: str, drop: Callable[[str], bool]) -> bytes:
    """The head as forwarded: `target` in its request line, without the headers `drop` names."""
    lines = [f"{head.method} {target} {head.version}"]
    lines += [f"{n}: {v}" for n, v in head.headers if not drop(n.lower())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


Write = Callable[[bytes], Awaitable[None]]


async def copy_body(reader: asyncio.StreamReader, write: Write, how: Framing) -> None:
    """Copy one request's body from `reader` to `write`, framed as `how` says (chunked: re-chunked).
    Raises BadRequest for a malformed chunk, IncompleteReadError when the client stops midway."""
    if not how.chunked:
        await _copy_exactly(reader, write, how.length)
        return
    while True:
        line = await _line(reader)
        size_text = line.split(b";", 1)[0].strip(b" \t")
        if not size_text or len(size_text) > 16 or not all(c in b"0123456789abcdefABCDEF" for c in size_text):
            raise BadRequest(f"a malformed chunk size: {line[:100]!r}")
        size = int(size_text, 16)
        if size == 0:
            while await _line(reader):  # trailers: dropped (a header the proxy would not have checked)
                pass
            await write(b"0\r\n\r\n")
            return
        await write(b"%x\r\n" % size)
        await _copy_exactly(reader, write, size)
        if await reader.readexactly(2) != b"\r\n":
            raise BadRequest("a chunk not followed by CRLF")
        await write(b"\r\n")


async def _copy_exactly(reader: asyncio.StreamReader, write: Write, n: int) -> None:
    while n:
        piece = await reader.read(min(n, _PIECE))
        if not piece:
            raise asyncio.IncompleteReadError(b"", n)
        n -= len(piece)
        await write(piece)


async def _line(reader: asyncio.StreamReader) -> bytes:
    """One CRLF-ended line, without it; LINE_LIMIT at most."""
    try:
        line = await reader.readuntil(b"\r\n")
    except asyncio.LimitOverrunError:
        raise BadRequest("a chunk line over the stream's limit") from None
    if len(line) > LINE_LIMIT or b"\n" in line[:-2] or b"\r" in line[:-2]:
        raise BadRequest("a malformed chunk line")
    return line[:-2]


def split_host_port(authority: str, default: int) -> tuple[str, int]:
    if authority.startswith("["):
        host, _, rest = authority[1:].partition("]")
        return host, int(rest[1:]) if rest.startswith(":") else default
    host, sep, port = authority.rpartition(":")
    if sep and port.isdigit():
        return host, int(port)
    return authority, default


class Forbidden(BadRequest):
    """A request the proxy understood and does not let through (answered 403, not 400)."""


def origin(head: Head, opened_for: tuple[str, int] | None = None) -> tuple[str, int, str]:
    """An absolute-form request's host, port and origin-form target; Forbidden when `opened_for` (the
    connection's host and port) is another."""
    target = head.target
    if target[:7].lower() != "http://":
        raise BadRequest(f"not a proxy request: {target[:200]}")
    rest = target[7:]
    cut = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    authority, path = rest[:cut], rest[cut:].partition("#")[0]  # a fragment is the client's, never sent
    if not _AUTHORITY.fullmatch(authority):  # userinfo (`allowed@evil`) included
        raise BadRequest(f"a malformed authority in {target[:200]}")
    host, port = split_host_port(authority, 80)
    host = host.lower()
    if opened_for is not None and (host, port) != opened_for:
        raise Forbidden(f"a request for {host}:{port} on a connection opened for {opened_for[0]}:{opened_for[1]}")
    return host, port, path if path.startswith("/") else "/" + path


def check_request(head: Head, host: str, port: int) -> None:
    """Raises Forbidden unless the request's Host names `host:port`, or BadRequest when its framing is one the
    proxy does not forward."""
    value = head.one("host")
    if value is None:
        raise Forbidden(f"a request without a Host header (it must name {host}:{port})")
    named, named_port = split_host_port(value, 80)
    if (named.lower(), named_port) != (host, port):
        # what the server routes by: a listed CDN host in the target and another site in Host is domain fronting
        raise Forbidden(f"the Host header names {value[:200]}, not {host}:{port} the request was made for")
    if head.one("upgrade") is not None:
        raise Forbidden("a protocol upgrade (the bytes after it could not be checked)")
    framing(head)


async def send(head: Head, path: str, reader: asyncio.StreamReader, up: asyncio.StreamWriter) -> None:
    """One request to the server: its head as parsed (origin-form, no Proxy-* headers), then its body."""
    async def write(data: bytes) -> None:
        up.write(data)
        await up.drain()

    up.write(serialise(head, path, lambda name: name.startswith("proxy-")))
    await copy_body(reader, write, framing(head))


async def next_head(reader: asyncio.StreamReader, limit: int) -> Head | None:
    """The next request on a kept-alive connection; None when the client closed it."""
    try:
        raw = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    except asyncio.LimitOverrunError:
        raise BadRequest("request head too large") from None
    if len(raw) > limit:
        raise BadRequest("request head too large")
    return parse_head(raw)
