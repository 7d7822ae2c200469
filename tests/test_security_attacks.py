"""Attacks on the boundary, tried for real: each test is one way in that was found open (or nearly), and
shows it closed. Real hypercorn on loopback, a real PostgreSQL, the real MCP transport."""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit

from tests.pg import DB
from tests.web import ingress_server

TOKEN = "s3cret-token"


async def _slow_login(url: str, guess: str, go: asyncio.Event) -> int:
    """POST /login whose headers arrive first and whose body only once `go` is set."""
    parts = urlsplit(url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    body = f"token={guess}".encode()
    writer.write(f"POST /login HTTP/1.1\r\nHost: {parts.netloc}\r\nContent-Type: application/x-www-form-urlencoded\r\n"
                 f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode())
    await writer.drain()
    await go.wait()
    writer.write(body)
    await writer.drain()
    status = int((await reader.readline()).split()[1])
    writer.close()
    return status


async def test_wrong_logins_held_open_in_parallel_cannot_outrun_the_limiter(db: DB) -> None:
    # 40 guesses whose bodies are held back until all have passed the limiter's first look: without a
    # second look once the body is in, every one of them gets a verdict (401) instead of 429
    async with ingress_server(db.ingress_dsn, open_mode=False, auth_mode="token", auth_token=TOKEN) as url:
        go = asyncio.Event()
        guesses = [asyncio.create_task(_slow_login(url, f"wrong{i}", go)) for i in range(40)]
        await asyncio.sleep(1.5)
        go.set()
        codes = await asyncio.gather(*guesses)
    assert codes.count(401) <= 10, codes
    assert codes.count(429) >= 30, codes
