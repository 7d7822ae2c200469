"""A sandboxed spawn's gateway on its own (real sockets, no CLI): the proxy admits only the allowlist and never an
internal address in any spelling, a spawn cannot hold more connections than its limit or a request head open
for long, a forward costs its service nothing until the client speaks, the sandbox's command starts only once every
forwarder accepts, and a launcher that ends takes its forwarders with it."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import psutil
import pytest

from executor.sandbox import bwrap, gateway
from executor.sandbox.bwrap import SandboxPolicy, SpawnBox
from executor.sandbox.gateway import Gateway, parse_allowlist
from tests.harness import sandbox_for
from tests.served import free_port
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
            listed = await _ask(sock, f"GET http://127.0.0.2:{port}/x HTTP/1.1\r\nHost: 127.0.0.2:{port}\r\n\r\n"
                                      .encode())
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


async def test_a_forward_reaches_its_service_only_once_the_client_speaks(tmp_path: Path) -> None:
    """The launcher's readiness try at every spawn's start (a connect and a close) costs the service nothing; a
    request that follows is forwarded whole, its first bytes included."""
    accepted: list[int] = []

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(1)
        head = await reader.readuntil(b"\r\n\r\n")
        body = head.split(b"\r\n", 1)[0]
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    gw = await Gateway.open(tmp_path / "gw", {port: ("127.0.0.1", port)}, (), "t")
    try:
        _, probe = await asyncio.open_unix_connection(str(gw.directory / f"{port}.sock"))
        probe.close()
        # accepted after the probe, so answered only once the probe's connection was handled
        reply = await _ask(gw.directory / f"{port}.sock", b"GET /x HTTP/1.1\r\nHost: a\r\n\r\n")
        await until(lambda: not gw.conns, lambda: f"the gateway to let go of {len(gw.conns)} connections", 10,
                    every=0.01)
    finally:
        await gw.close()
        server.close()
    assert reply.startswith(b"HTTP/1.1 200") and reply.endswith(b"GET /x HTTP/1.1")
    assert len(accepted) == 1  # the request's, not the probe's


async def _first_tries(policy: SandboxPolicy, box: SpawnBox, ports: list[int]) -> list[str]:
    """What a command that connects to each forwarded port the instant it starts (as the CLI's MCP client would,
    had it no start of its own) finds, in one sandbox."""
    probe = ["bash", "-c", 'for p; do { : >"/dev/tcp/127.0.0.1/$p"; } 2>/dev/null && echo up || echo refused; done',
             "probe", *map(str, ports)]
    proc = await asyncio.create_subprocess_exec(*bwrap.wrap(policy, box, probe), stdout=asyncio.subprocess.PIPE)
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    return out.decode().split()


async def test_the_sandboxed_command_starts_once_every_forwarder_accepts(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """No forwarder races the command's first connection, spawn after spawn; with the launcher's wait taken out (the
    negative control), the same command finds one refusing."""
    async with _target() as port:
        gw = await Gateway.open(tmp_path / "gw", {port: ("127.0.0.2", port), port + 1: ("127.0.0.2", port)}, (),
                                "t")
        workdir = tmp_path / "work"
        workdir.mkdir()
        box = SpawnBox(workdir=workdir, ports=tuple(gw.forwards), sockets_dir=gw.directory)
        ports = [port, port + 1, bwrap.PROXY_PORT]
        policy = sandbox_for(tmp_path)
        try:
            waited = [await _first_tries(policy, box, ports) for _ in range(10)]
            start, end = bwrap._LAUNCHER.index("{ exec {pause}"), bwrap._LAUNCHER.index("unset SOCKETS")
            monkeypatch.setattr(bwrap, "_LAUNCHER", bwrap._LAUNCHER[:start] + bwrap._LAUNCHER[end:])
            raced = [await _first_tries(policy, box, ports) for _ in range(5)]
        finally:
            await gw.close()
    assert waited == [["up"] * 3] * 10
    assert any("refused" in tries for tries in raced), raced  # a forwarder can win the race now and then


async def _forwarders_after_no_command(tmp_path: Path) -> list[psutil.Process]:
    """The launcher of a sandbox started ahead, run as bubblewrap runs it, whose command never comes (its ARGV_FD
    ends empty, as when the executor died): the forwarders it had started, once it has ended."""
    ports = [free_port(), free_port()]
    read_end, write_end = os.pipe()
    proc = await asyncio.create_subprocess_exec(
        "bash", "-c", bwrap._LAUNCHER, "petal-sandbox", *(f"{p}={p}.sock" for p in ports), "--",
        env={"PATH": os.environ["PATH"], "SOCKETS": str(tmp_path), "ARGV_FD": str(read_end)}, pass_fds=(read_end,))
    os.close(read_end)
    try:
        launcher = psutil.Process(proc.pid)
        forwarders: list[psutil.Process] = []

        def both_started() -> bool:
            forwarders[:] = [c for c in launcher.children() if c.name() == "socat"]
            return len(forwarders) == len(ports)

        await until(both_started, "the launcher's forwarders", 20)
    finally:
        os.close(write_end)  # no command: the launcher ends
    assert await asyncio.wait_for(proc.wait(), 30) == 0
    return forwarders


def _alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    alive = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                alive.append(p)
        except psutil.NoSuchProcess:
            pass
    return alive


async def test_a_launcher_that_ends_without_its_command_ends_its_forwarders_too(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """bubblewrap's init waits for every process of its sandbox: a forwarder left behind keeps the sandbox up for
    good once the outer bubblewrap is gone. Without the launcher's EXIT trap (the negative control) they stay."""
    forwarders = await _forwarders_after_no_command(tmp_path)
    try:
        await until(lambda: not _alive(forwarders), lambda: f"the forwarders to end: {_alive(forwarders)}", 10)
    finally:
        _kill(forwarders)

    trap = next(line for line in bwrap._LAUNCHER.splitlines() if line.startswith("trap ") and "EXIT" in line)
    monkeypatch.setattr(bwrap, "_LAUNCHER", bwrap._LAUNCHER.replace(trap + "\n", ""))
    left = await _forwarders_after_no_command(tmp_path)
    try:
        await asyncio.sleep(0.5)  # must not happen within: nothing ends them now
        assert len(_alive(left)) == 2
    finally:
        _kill(left)


def _kill(procs: list[psutil.Process]) -> None:
    for p in _alive(procs):
        p.kill()
