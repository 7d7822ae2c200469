"""The gateway's proxy decides on the host the bytes go to, not only on the request line (issue 47, item 5): a
CONNECT tunnel whose TLS ClientHello names another host (SNI), names none, or is no TLS at all is closed and
journaled; a plain HTTP request whose `Host` names another site than its target — the first on a connection or
any later one kept alive — is refused. Real sockets through the real gateway to servers on loopback; each attack
has its negative control (the same bytes with the check taken out reach the server)."""

from __future__ import annotations

import asyncio
import datetime
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from executor.sandbox import gateway, http1
from executor.sandbox.gateway import Gateway, parse_allowlist
from tests.wait import until

ADDRESS = "127.0.0.2"
# the names the tests' allowlists use, "resolved" to the loopback servers (a public name would resolve to a public
# address; the gateway refuses a name resolving to loopback, and that check is not what these tests are about)
NAMES = ("allowed.test", "evil.test")


@pytest.fixture(autouse=True)
def _names_resolve_to_the_test_servers(monkeypatch: pytest.MonkeyPatch) -> None:
    real = Gateway._permitted

    async def permitted(self: Gateway, host: str, port: int) -> str:
        verdict = await real(self, host, port)
        if verdict.startswith("!") and "allowlist" not in verdict and host.lower() in NAMES:
            return ADDRESS  # on the allowlist (the real check said so): only the lookup is stood in for
        return verdict

    monkeypatch.setattr(Gateway, "_permitted", permitted)


def _certificate(directory: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "allowed.test")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(1).not_valid_before(now - datetime.timedelta(minutes=1))
            .not_valid_after(now + datetime.timedelta(hours=1)).sign(key, hashes.SHA256()))
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


@dataclass
class TLSServer:
    port: int
    names: list[str | None] = field(default_factory=list)  # the SNI of every handshake it began


@asynccontextmanager
async def _tls_server(tmp_path: Path) -> AsyncIterator[TLSServer]:
    """A TLS echo server on 127.0.0.2: answers each line with "echo: <line>"."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(*_certificate(tmp_path))
    server = TLSServer(0)
    ctx.sni_callback = lambda sock, name, _ctx: server.names.append(name)

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while line := await reader.readline():
                writer.write(b"echo: " + line)
                await writer.drain()
        except (ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()

    listening = await asyncio.start_server(echo, ADDRESS, 0, ssl=ctx)
    server.port = listening.sockets[0].getsockname()[1]
    try:
        yield server
    finally:
        listening.close()


async def _tunnel(sock: Path, target: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_unix_connection(str(sock))
    writer.write(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
    answer = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    assert answer.startswith(b"HTTP/1.1 200"), answer
    return reader, writer


async def _tls_echo(sock: Path, target: str, server_hostname: str | None, piece: int = 1 << 16) -> bytes:
    """A TLS handshake through a CONNECT tunnel (the ClientHello written `piece` bytes at a time), then one line
    echoed; what came back, or raises (ssl.SSLError, ConnectionError) when the tunnel was cut."""
    reader, writer = await _tunnel(sock, target)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ctx.wrap_bio(incoming, outgoing, server_hostname=server_hostname)

    async def flush() -> None:
        data = outgoing.read()
        for at in range(0, len(data), piece):
            writer.write(data[at:at + piece])
            await writer.drain()

    async def receive() -> None:
        data = await asyncio.wait_for(reader.read(1 << 16), 10)
        if not data:
            raise ConnectionError("the tunnel was closed")
        incoming.write(data)

    try:
        while True:
            try:
                tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                await flush()
                await receive()
        tls.write(b"ping\n")
        await flush()
        while True:
            try:
                return tls.read(1 << 16)
            except ssl.SSLWantReadError:
                await receive()
    finally:
        writer.close()


@asynccontextmanager
async def _gateway(tmp_path: Path, *allow: str) -> AsyncIterator[Gateway]:
    gw = await Gateway.open(tmp_path / "gw", {}, parse_allowlist(allow), "t")
    try:
        yield gw
    finally:
        await gw.close()


async def _cut(sock: Path, target: str, server_hostname: str | None, piece: int = 1 << 16) -> str:
    """How the tunnel ended for a client whose ClientHello the gateway refuses."""
    try:
        echoed = await _tls_echo(sock, target, server_hostname, piece)
    except ssl.SSLError as exc:
        return f"alert: {exc.reason}"
    except ConnectionError as exc:
        return f"closed: {exc}"
    raise AssertionError(f"the tunnel carried a TLS session: {echoed!r}")


async def test_a_tunnel_whose_client_hello_names_another_host_is_closed_and_journaled(tmp_path: Path) -> None:
    async with _tls_server(tmp_path) as server, _gateway(tmp_path, f"allowed.test:{server.port}") as gw:
        sock, target = gw.directory / "proxy.sock", f"allowed.test:{server.port}"
        matching = await _tls_echo(sock, target, "allowed.test")
        # the same name, the ClientHello written a byte at a time (the gateway reads until it holds all of it)
        split = await _tls_echo(sock, target, "allowed.test", piece=1)
        assert server.names == ["allowed.test", "allowed.test"]
        fronted = await _cut(sock, target, "evil.test")
        nameless = await _cut(sock, target, None)
        fronted_split = await _cut(sock, target, "evil.test", piece=7)
        reached = list(server.names)
    assert matching == split == b"echo: ping\n"
    # the refused hellos never reached the server: it began no handshake for them
    assert reached == ["allowed.test", "allowed.test"]
    assert fronted == nameless == fronted_split == "alert: TLSV1_ALERT_ACCESS_DENIED", (fronted, nameless)
    assert gw.refused == [f"CONNECT {target}: the ClientHello names evil.test (SNI), not allowed.test",
                          f"CONNECT {target}: the ClientHello names no server (no SNI): a tunnel to allowed.test "
                          "must name allowed.test",
                          f"CONNECT {target}: the ClientHello names evil.test (SNI), not allowed.test"]


async def test_without_the_sni_check_the_same_tunnel_reaches_the_other_host(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Negative control: the check taken out, a CONNECT to the listed host carries a TLS session the server
    begins for evil.test (a CDN routing by SNI would serve that site)."""
    monkeypatch.setattr(gateway, "_named_otherwise", lambda hello, host: None)
    async with _tls_server(tmp_path) as server, _gateway(tmp_path, f"allowed.test:{server.port}") as gw:
        echoed = await _tls_echo(gw.directory / "proxy.sock", f"allowed.test:{server.port}", "evil.test")
    assert echoed == b"echo: ping\n" and server.names == ["evil.test"] and gw.refused == []


async def test_a_tunnel_to_a_listed_address_carries_tls_without_a_name_but_not_with_one(tmp_path: Path) -> None:
    async with _tls_server(tmp_path) as server, _gateway(tmp_path, f"{ADDRESS}:{server.port}") as gw:
        sock, target = gw.directory / "proxy.sock", f"{ADDRESS}:{server.port}"
        plain = await _tls_echo(sock, target, None)
        named = await _cut(sock, target, "evil.test")
    assert plain == b"echo: ping\n" and server.names == [None]
    assert named == "alert: TLSV1_ALERT_ACCESS_DENIED"
    assert gw.refused == [f"CONNECT {target}: the ClientHello names evil.test (SNI) in a tunnel to the address "
                          f"{ADDRESS}"]


async def _closed(reader: asyncio.StreamReader) -> bool:
    """Whether the gateway closed the connection without another byte."""
    return await _last_bytes(reader) == b""


async def _last_bytes(reader: asyncio.StreamReader) -> bytes:
    """What comes before the connection's end (b"" for a reset)."""
    try:
        return await asyncio.wait_for(reader.read(), 10)
    except ConnectionResetError:
        return b""


async def test_a_tunnel_that_carries_no_tls_or_none_in_time_is_closed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gateway, "HEAD_TIMEOUT_S", 0.5)
    accepted: list[bytes] = []

    async def record(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(await reader.read())
        writer.close()

    server = await asyncio.start_server(record, ADDRESS, 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with _gateway(tmp_path, f"allowed.test:{port}") as gw:
            sock, target = gw.directory / "proxy.sock", f"allowed.test:{port}"
            reader, writer = await _tunnel(sock, target)
            writer.write(b"GET / HTTP/1.1\r\nHost: evil.test\r\n\r\n")  # plain HTTP inside a tunnel
            cleartext = await _last_bytes(reader)
            writer.close()
            reader, writer = await _tunnel(sock, target)
            writer.write(b"\x16\x03\x01\x02\x00\x01")  # a hello begun, never finished
            silent = await _last_bytes(reader)
            writer.close()
            await until(lambda: len(accepted) == 2, lambda: f"the server to see 2 connections end: {accepted}", 10)
    finally:
        server.close()
    assert cleartext == b""  # closed: the client spoke no TLS, so no TLS alert
    assert silent == gateway._ACCESS_DENIED  # the client began TLS: it is told it was refused
    assert accepted == [b"", b""]  # connected (before the 200) but sent nothing
    assert gw.refused == [f"CONNECT {target}: not a TLS ClientHello (not a TLS handshake record (first byte 0x47))",
                          f"CONNECT {target}: no TLS ClientHello within 0.5 s"]


@dataclass
class HTTPServer:
    port: int
    # request line, Host, body (as framed: a chunked one's extensions and trailers were dropped on the way)
    requests: list[tuple[str, str, bytes]] = field(default_factory=list)


@asynccontextmanager
async def _http_server() -> AsyncIterator[HTTPServer]:
    """A keep-alive HTTP/1.1 server on 127.0.0.2 recording each request; answers "ok <n>"."""
    server = HTTPServer(0)

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = http1.parse_head(await reader.readuntil(b"\r\n\r\n"))
                body = bytearray()

                async def collect(data: bytes) -> None:
                    body.extend(data)

                await http1.copy_body(reader, collect, http1.framing(head))
                server.requests.append((f"{head.method} {head.target}", head.one("host") or "", bytes(body)))
                text = f"ok {len(server.requests)}".encode()
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(text), text))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    listening = await asyncio.start_server(answer, ADDRESS, 0)
    server.port = listening.sockets[0].getsockname()[1]
    try:
        yield server
    finally:
        listening.close()


def _get(port: int, host: str, path: str = "/x", target_host: str = "allowed.test") -> bytes:
    return f"GET http://{target_host}:{port}{path} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()


async def _response(reader: asyncio.StreamReader) -> bytes:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
    return head.split(b"\r\n")[0] + b" " + await reader.readexactly(length)


async def test_a_plain_request_whose_host_names_another_site_is_refused_on_any_request_of_a_connection(
        tmp_path: Path) -> None:
    async with _http_server() as server, _gateway(tmp_path, f"allowed.test:{server.port}") as gw:
        sock, port = gw.directory / "proxy.sock", server.port
        opened: list[asyncio.StreamWriter] = []

        async def connect() -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
            reader, writer = await asyncio.open_unix_connection(str(sock))
            opened.append(writer)
            return reader, writer

        reader, writer = await connect()
        # the first request names another site: 403, nothing forwarded
        writer.write(_get(port, "evil.test"))
        first = await asyncio.wait_for(reader.read(), 10)
        # a connection kept alive: two good requests (one with a chunked body, forwarded re-chunked), then one
        # whose Host names another site, then one for another host: the connection is closed at the third
        reader, writer = await connect()
        writer.write(_get(port, f"allowed.test:{port}", "/a"))
        ok_a = await _response(reader)
        writer.write(f"POST http://allowed.test:{port}/b HTTP/1.1\r\nHost: allowed.test:{port}\r\n"
                     "Transfer-Encoding: chunked\r\n\r\n3;x=y\r\nabc\r\n2\r\nde\r\n0\r\nX-Trailer: 1\r\n\r\n".encode())
        ok_b = await _response(reader)
        writer.write(_get(port, "evil.test", "/c") + _get(port, f"allowed.test:{port}", "/d"))
        kept_alive_fronted = await _closed(reader)
        # another host on the connection, even one on the list, is not the connection's
        reader, writer = await connect()
        writer.write(_get(port, f"allowed.test:{port}", "/e") + _get(port, f"evil.test:{port}", "/f", "evil.test"))
        ok_e = await _response(reader)
        switched = await _closed(reader)
        seen = list(server.requests)
        for w in opened:
            w.close()
    assert first.startswith(b"HTTP/1.1 403") and b"the Host header names evil.test" in first
    assert (ok_a, ok_b, ok_e) == (b"HTTP/1.1 200 OK ok 1", b"HTTP/1.1 200 OK ok 2", b"HTTP/1.1 200 OK ok 3")
    assert kept_alive_fronted and switched
    assert seen == [("GET /a", f"allowed.test:{port}", b""), ("POST /b", f"allowed.test:{port}", b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"),
                    ("GET /e", f"allowed.test:{port}", b"")]
    assert gw.refused == [f"the Host header names evil.test, not allowed.test:{port} the request was made for"] * 2 + [
        f"a request for evil.test:{port} on a connection opened for allowed.test:{port}"]


async def test_without_the_host_check_the_fronted_request_reaches_the_server_naming_the_other_site(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Negative control: the check taken out, the listed host's server is asked for evil.test, first request and
    kept-alive alike (a CDN routing by Host would serve that site)."""
    monkeypatch.setattr(http1, "check_request", lambda head, host, port: None)
    async with _http_server() as server, _gateway(tmp_path, f"allowed.test:{server.port}") as gw:
        reader, writer = await asyncio.open_unix_connection(str(gw.directory / "proxy.sock"))
        writer.write(_get(server.port, "evil.test", "/a"))
        first = await _response(reader)
        writer.write(_get(server.port, "evil.test", "/b"))
        second = await _response(reader)
        writer.close()
        await writer.wait_closed()
    assert (first, second) == (b"HTTP/1.1 200 OK ok 1", b"HTTP/1.1 200 OK ok 2")
    assert [(line, host) for line, host, _ in server.requests] == [("GET /a", "evil.test"), ("GET /b", "evil.test")]
    assert gw.refused == []


def test_the_negative_controls_patch_what_the_gateway_calls() -> None:
    # the controls above take the checks out by name: a rename would turn them into tests of nothing
    source = Path(gateway.__file__).read_text()
    assert "_named_otherwise(hello, host)" in source and source.count("http1.check_request(") == 2
