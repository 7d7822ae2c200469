"""A sandboxed spawn's gateway on its own (real sockets, no CLI): the proxy admits only the allowlist and never an
internal address in any spelling, and a spawn cannot hold more connections than its limit or a request head open
for long."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from executor.sandbox import gateway
from executor.sandbox.gateway import Gateway, parse_allowlist
from tests.wait import until


@asynccontextmanager
async def _target() -> AsyncIterator[int]:
    """An HTTP server on 127.0.0.2 answering every request with 200 "ok"."""
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.2", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()


async def _ask(sock: Path, request: bytes) -> bytes:
    reader, writer = await asyncio.open_unix_connection(str(sock))
    writer.write(request)
    await writer.drain()
    try:
        return await asyncio.wait_for(reader.read(4096), 10)
    finally:
        writer.close()


async def test_the_proxy_admits_the_listed_address_and_refuses_every_other_spelling_of_loopback(
        tmp_path: Path) -> None:
    async with _target() as port:
        gw = await Gateway.open(tmp_path / "gw", {}, parse_allowlist([f"127.0.0.2:{port}", "localhost"]), "t")
        sock = gw.directory / "proxy.sock"
        try:
            listed = await _ask(sock, f"GET http://127.0.0.2:{port}/x HTTP/1.1\r\nHost: a\r\n\r\n".encode())
            tunnel = await _ask(sock, f"CONNECT 127.0.0.2:{port} HTTP/1.1\r\n\r\n".encode())
            refused = {target: await _ask(sock, f"CONNECT {target} HTTP/1.1\r\n\r\n".encode()) for target in (
                f"127.0.0.1:{port}", f"[::ffff:127.0.0.2]:{port}", f"2130706434:{port}", f"0x7f000002:{port}",
                f"127.2:{port}", f"127.0.0.2:{port + 1}",
                f"localhost:{port}",  # on the list, but a name that resolves to loopback
                "example.invalid:443")}
        finally:
            await gw.close()
    assert listed.startswith(b"HTTP/1.1 200") and listed.endswith(b"ok")
    assert tunnel.startswith(b"HTTP/1.1 200 Connection established")
    for target, answer in refused.items():
        assert answer.startswith(b"HTTP/1.1 403"), (target, answer)
    assert b"internal address" in refused[f"localhost:{port}"]
    assert not gw.directory.exists()  # closing removes the spawn's sockets


async def _closed(reader: asyncio.StreamReader) -> bool:
    """Whether the gateway closed this connection (an end of file, or a reset: it never read what was sent)."""
    try:
        return await asyncio.wait_for(reader.read(), 5) == b""
    except ConnectionResetError:
        return True


async def test_a_spawn_cannot_hold_more_connections_than_its_limit_nor_a_request_head_open(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gateway, "MAX_CONNECTIONS", 8)
    monkeypatch.setattr(gateway, "HEAD_TIMEOUT_S", 0.3)
    gw = await Gateway.open(tmp_path / "gw", {}, (), "t")
    held = []
    try:
        for _ in range(20):
            held.append(await asyncio.open_unix_connection(str(gw.directory / "proxy.sock")))
            held[-1][1].write(b"CONNECT half")  # a head never finished
        # the first 8 are taken (their heads' timeouts running), the other 12 are closed at once
        await until(lambda: len(gw.conns) >= 8, lambda: f"the gateway to take 8 connections (it holds {len(gw.conns)})",
                    10, every=0.01)
        over = [await _closed(r) for r, _ in held[8:]]
        kept = len(gw.conns)
        # a head that never ends is cut off after the timeout
        timed_out = [await _closed(r) for r, _ in held[:8]]
        left = len(gw.conns)
    finally:
        for _, w in held:
            w.close()
        await gw.close()
    assert over == [True] * 12 and kept == 8
    assert timed_out == [True] * 8 and left == 0
    assert "too many connections" in gw.refused
