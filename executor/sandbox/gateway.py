"""One sandboxed spawn's ways out (executor/sandbox/bwrap.py): Unix sockets in a directory of its own, which the
sandbox's forwarders reach from inside its network namespace.

- `<port>.sock` for each loopback service the CLI itself needs (the harness MCP; a model server on loopback in
  tests and the demo): piped to that port and nowhere else.
- `proxy.sock`: an HTTP proxy (CONNECT for TLS, absolute-URI requests for plain HTTP) that lets through only the
  hosts on the spawn's allowlist, and never to a loopback, private or link-local address unless that very address
  is on it (a name on the list that resolves to 127.0.0.1 does not open the ingress). Refusals are answered 403
  with the reason, and logged.
  The host the bytes go to is the one checked, not only the request line's: a tunnel's TLS ClientHello must name
  its CONNECT host (SNI, peeked in `sni.py`: TLS is not terminated), else it is closed after a TLS alert; every
  plain HTTP request on a connection (kept alive or not) must be for the connection's host, in its target and its
  `Host` header alike, and is forwarded as parsed (`http1.py`). A CDN serving many sites from one address routes
  by those names: a listed CDN host in the request line and another site in SNI or `Host` is domain fronting.
  (A name inside the TLS session, its HTTP `Host`, stays out of sight without terminating TLS.)
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ipaddress
import shutil
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from executor.sandbox import http1, sni
from shared import logs

log = logs.get(__name__)

HEAD_LIMIT = 16 * 1024
CONNECT_TIMEOUT_S = 10.0
# A spawn's connections at once, and how long a proxy request's head may take: a worker holding hundreds of idle
# connections would use up the executor's file descriptors.
MAX_CONNECTIONS = 64
HEAD_TIMEOUT_S = 10.0
# how long the answers to a connection's earlier requests may take to come back once a later one is refused
DRAIN_S = 10.0
_PIPE_CHUNK = 1 << 16


@dataclass(frozen=True)
class Allow:
    """One allowlist entry: `host`, `host:port` or `*.domain` (any port of a bare host)."""

    host: str
    port: int | None

    @classmethod
    def parse(cls, entry: str) -> Allow:
        entry = entry.strip().lower()
        if not entry:
            raise ValueError("an empty allowlist entry")
        host, port = entry, None
        if entry.startswith("["):  # [v6]:port
            host, _, rest = entry[1:].partition("]")
            port = int(rest[1:]) if rest.startswith(":") else None
        elif entry.count(":") == 1:
            host, _, p = entry.partition(":")
            port = int(p)
        return cls(host, port)

    def covers(self, host: str, port: int) -> bool:
        if self.port is not None and self.port != port:
            return False
        if self.host.startswith("*."):
            return host.endswith(self.host[1:])
        return host == self.host

    @property
    def is_address(self) -> bool:
        with contextlib.suppress(ValueError):
            ipaddress.ip_address(self.host)
            return True
        return False


def parse_allowlist(entries: Sequence[str]) -> tuple[Allow, ...]:
    return tuple(Allow.parse(e) for e in entries if e.strip())


def _internal(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    return ip.is_loopback or ip.is_private or ip.is_link_local or ip.is_unspecified or ip.is_multicast \
        or ip.is_reserved


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(_PIPE_CHUNK):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


async def _splice(a: tuple[asyncio.StreamReader, asyncio.StreamWriter],
                  b: tuple[asyncio.StreamReader, asyncio.StreamWriter]) -> None:
    await asyncio.gather(_pipe(a[0], b[1]), _pipe(b[0], a[1]))


class Gateway:
    """The sockets of one spawn; `close` removes them (and cuts what is still connected)."""

    def __init__(self, directory: Path, forwards: dict[int, tuple[str, int]], allow: Sequence[Allow], label: str):
        self.directory = directory
        self.forwards = forwards
        self.allow = tuple(allow)
        self.label = label
        self.servers: list[asyncio.Server] = []
        self.conns: set[asyncio.StreamWriter] = set()
        self.refused: list[str] = []

    @classmethod
    async def open(cls, directory: Path, forwards: dict[int, tuple[str, int]], allow: Sequence[Allow],
                   label: str) -> Gateway:
        if directory.exists():
            shutil.rmtree(directory)
        directory.mkdir(mode=0o700, parents=True)
        gw = cls(directory, forwards, allow, label)
        try:
            for port, target in forwards.items():
                gw.servers.append(await asyncio.start_unix_server(
                    functools.partial(gw._forward, target=target), path=str(directory / f"{port}.sock")))
            gw.servers.append(await asyncio.start_unix_server(gw._proxy, path=str(directory / "proxy.sock")))
        except BaseException:
            await gw.close()
            raise
        return gw

    async def close(self) -> None:
        for server in self.servers:
            server.close()
        for w in list(self.conns):
            with contextlib.suppress(Exception):
                w.close()
        shutil.rmtree(self.directory, ignore_errors=True)

    def _track(self, w: asyncio.StreamWriter) -> None:
        self.conns.add(w)

    def _full(self, writer: asyncio.StreamWriter) -> bool:
        """Over the spawn's connection limit: the connection is closed at once (and said once in the log)."""
        if len(self.conns) < MAX_CONNECTIONS:
            return False
        if not self.refused or self.refused[-1] != "too many connections":
            self.refused.append("too many connections")
            log.warning("sandbox_gateway_full", spawn=self.label, limit=MAX_CONNECTIONS)
        writer.close()
        return True

    async def _forward(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                       target: tuple[str, int]) -> None:
        if self._full(writer):
            return
        self._track(writer)
        # the service is reached once the client has said something: the launcher's readiness tries (a connect
        # and a close, at every spawn's start) then cost no connection to it
        try:
            first = await reader.read(_PIPE_CHUNK)
            up = await asyncio.wait_for(asyncio.open_connection(*target), CONNECT_TIMEOUT_S) if first else None
        except (OSError, TimeoutError):
            up = None
        if up is None:
            writer.close()
            self.conns.discard(writer)
            return
        self._track(up[1])
        try:
            up[1].write(first)
            await _splice((reader, writer), up)
        finally:
            self.conns.discard(writer)
            self.conns.discard(up[1])

    async def _proxy(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._full(writer):
            return
        self._track(writer)
        try:
            await self._proxy_one(reader, writer)
        except (ConnectionError, OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError,
                TimeoutError):
            pass
        finally:
            self.conns.discard(writer)
            with contextlib.suppress(Exception):
                writer.close()

    async def _refuse(self, writer: asyncio.StreamWriter, status: str, why: str) -> None:
        self._journal(why)
        body = f"petal-dispatch sandbox: {why}\n".encode()
        writer.write(f"HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}\r\n"
                     "Connection: close\r\n\r\n".encode() + body)
        with contextlib.suppress(Exception):
            await writer.drain()

    def _journal(self, why: str) -> None:
        """A refusal: kept on the gateway (the spawn's record of what it was refused) and logged."""
        self.refused.append(why)
        log.warning("sandbox_proxy_refused", spawn=self.label, reason=why)

    async def _proxy_one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raw = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT_S)
        if len(raw) > HEAD_LIMIT:
            await self._refuse(writer, "431 Request Header Fields Too Large", "request head too large")
            return
        try:
            head = http1.parse_head(raw)
        except http1.BadRequest as exc:
            await self._refuse(writer, "400 Bad Request", str(exc))
            return
        if head.method.upper() == "CONNECT":
            await self._tunnel(head, reader, writer)
        else:
            await self._plain(head, reader, writer)

    async def _open(self, writer: asyncio.StreamWriter, host: str,
                    port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        """A connection to an allowed `host:port`; None when refused (answered with the reason)."""
        address = await self._permitted(host, port)
        if isinstance(address, str) and address.startswith("!"):
            await self._refuse(writer, "403 Forbidden", address[1:])
            return None
        try:
            up = await asyncio.wait_for(asyncio.open_connection(address, port), CONNECT_TIMEOUT_S)
        except (OSError, TimeoutError) as exc:
            await self._refuse(writer, "502 Bad Gateway", f"{host}:{port} unreachable: {exc}")
            return None
        self._track(up[1])
        return up

    # ---- CONNECT: a tunnel whose TLS must name the host it was opened for --------------------------------

    async def _tunnel(self, head: http1.Head, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        host, port = http1.split_host_port(head.target, 443)
        up = await self._open(writer, host, port)
        if up is None:
            return
        try:
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            await writer.drain()
            hello = await self._client_hello(reader, writer, host, port)
            if hello is None:
                up[1].close()
                return
            up[1].write(hello)
            await _splice((reader, writer), up)
        finally:
            self.conns.discard(up[1])

    async def _client_hello(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str,
                            port: int) -> bytes | None:
        """The tunnel's first bytes, read until they hold the whole TLS ClientHello, if it names `host`;
        None when the tunnel is refused (closed, after a TLS alert if the client spoke TLS) or the client left."""
        data = b""
        try:
            async with asyncio.timeout(HEAD_TIMEOUT_S):
                while (hello := sni.parse(data)) is None:
                    if len(data) >= sni.MAX_BYTES:
                        raise sni.NotClientHello(f"no whole ClientHello in {len(data)} bytes")
                    chunk = await reader.read(_PIPE_CHUNK)
                    if not chunk:
                        return None
                    data += chunk
            why = _named_otherwise(hello, host)
        except sni.NotClientHello as exc:
            why = f"not a TLS ClientHello ({exc})"
        except TimeoutError:
            why = f"no TLS ClientHello within {HEAD_TIMEOUT_S:g} s"
        if why is None:
            return data
        self._journal(f"CONNECT {host}:{port}: {why}")
        if data[:1] == b"\x16":
            writer.write(_ACCESS_DENIED)
            with contextlib.suppress(Exception):
                await writer.drain()
        return None

    # ---- plain HTTP: every request's target and Host name the authority the connection was opened for ----

    async def _plain(self, head: http1.Head, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            host, port, path = http1.origin(head)
            http1.check_request(head, host, port)
        except http1.BadRequest as exc:
            status = "403 Forbidden" if isinstance(exc, http1.Forbidden) else "400 Bad Request"
            await self._refuse(writer, status, str(exc))
            return
        up = await self._open(writer, host, port)
        if up is None:
            return
        # responses go back as they come; requests are read, checked and written anew one by one
        responses = asyncio.create_task(_pipe(up[0], writer))
        refused = False
        try:
            while True:
                try:
                    await http1.send(head, path, reader, up[1])
                    next_head = await http1.next_head(reader, HEAD_LIMIT)
                    if next_head is None:
                        break
                    head = next_head
                    _, _, path = http1.origin(head, (host, port))
                    http1.check_request(head, host, port)
                except http1.BadRequest as exc:
                    self._journal(str(exc))
                    refused = True
                    break
            # the server's answers to what was sent still come back; after a refusal no answer of the proxy's
            # can follow them (it does not parse responses): the connection just ends once they are through
            if up[1].can_write_eof():
                up[1].write_eof()
            if refused:
                await asyncio.wait({responses}, timeout=DRAIN_S)
            else:
                await responses
        finally:
            responses.cancel()
            up[1].close()
            self.conns.discard(up[1])

    async def _permitted(self, host: str, port: int) -> str:
        """The address to connect to, or "!" and why not."""
        host = host.lower().strip("[]")
        rule = next((a for a in self.allow if a.covers(host, port)), None)
        if rule is None:
            return f"!{host}:{port} is not on the sandbox's allowlist"
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as exc:
            return f"!{host}: {exc}"
        addresses = [str(info[4][0]) for info in infos]
        # every address must be public, or be exactly the address the entry names
        for address in addresses:
            if _internal(address) and not (rule.is_address and ipaddress.ip_address(rule.host)
                                           == ipaddress.ip_address(address)):
                return f"!{host}:{port} resolves to {address}, an internal address"
        return addresses[0]


# a fatal TLS alert, access_denied (RFC 8446 §6): the client reports a refusal rather than a dropped connection
_ACCESS_DENIED = bytes([0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 49])


def _is_address(host: str) -> bool:
    with contextlib.suppress(ValueError):
        ipaddress.ip_address(host)
        return True
    return False


def _named_otherwise(hello: sni.ClientHello, host: str) -> str | None:
    """Why a ClientHello is not one for `host` (the CONNECT's), or None if it is."""
    host = host.lower().strip("[]")
    if hello.sealed_name:
        return "the ClientHello seals the name it is for (encrypted_client_hello)"
    if _is_address(host):
        # TLS names no address (RFC 6066): a name here would pick a site behind the listed address
        return None if hello.server_name is None else \
            f"the ClientHello names {hello.server_name} (SNI) in a tunnel to the address {host}"
    if hello.server_name is None:
        # a server given no name answers with a site of its choosing, not necessarily this host's
        return f"the ClientHello names no server (no SNI): a tunnel to {host} must name {host}"
    if hello.server_name != host:
        return f"the ClientHello names {hello.server_name} (SNI), not {host}"
    return None


