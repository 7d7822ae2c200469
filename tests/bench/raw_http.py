"""A keep-alive HTTP/1.1 client over asyncio streams, for the benchmarks' own requests.

A request goes out as one write; its response is read by Content-Length or by chunks, and nothing is
validated beyond the framing. httpx spent about 1 ms of CPU per request building and parsing (its
request and response models, its header and URL handling), on the same two cores as the services the
benchmark measures, and the client's share of a round trip is what a benchmark should keep least of: the
CLI's own client (node) reads a response in a fraction of that.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any
from urllib.parse import urlsplit


class HTTPError(Exception):
    pass


class Response:
    def __init__(self, status: int, headers: dict[str, str], body: bytes, at: float):
        self.status = status
        self.headers = headers
        self.body = body
        self.at = at  # perf_counter when its last byte was read

    def json(self) -> Any:
        return json.loads(self.body)

    def raise_for_status(self) -> None:
        if self.status >= 400:
            raise HTTPError(f"HTTP {self.status}: {self.body[:500]!r}")


class Client:
    """One connection at a time (requests on it go one after another), made again when the server closed it."""

    def __init__(self, url: str, headers: dict[str, str] | None = None):
        parts = urlsplit(url)
        assert parts.hostname is not None and parts.port is not None, url
        self.host, self.port, self.base = parts.hostname, parts.port, parts.path  # a request's path goes after it
        fixed = {"Host": f"{self.host}:{self.port}", **(headers or {})}
        self._fixed = "".join(f"{k}: {v}\r\n" for k, v in fixed.items()).encode()
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def _connection(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self._reader is None or self._writer is None or self._writer.is_closing():
            self._reader, self._writer = await asyncio.open_connection(self.host, self.port, limit=1 << 24)
        return self._reader, self._writer

    async def post_json(self, path: str, payload: Any) -> Response:
        body = json.dumps(payload).encode()
        head = (f"POST {self.base}{path} HTTP/1.1\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n").encode()
        reader, writer = await self._connection()
        writer.write(head + self._fixed + b"\r\n" + body)
        try:
            return await self._response(reader)
        except (asyncio.IncompleteReadError, ConnectionError):
            await self.close()
            raise

    async def _response(self, reader: asyncio.StreamReader) -> Response:
        lines = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        headers = {}
        for line in lines[1:]:
            if line:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
        if "content-length" in headers:
            body = await reader.readexactly(int(headers["content-length"]))
        elif headers.get("transfer-encoding", "").lower() == "chunked":
            parts = []
            while size := int((await reader.readuntil(b"\r\n")).split(b";")[0], 16):
                parts.append(await reader.readexactly(size))
                await reader.readexactly(2)
            await reader.readuntil(b"\r\n")  # the end of the trailers
            body = b"".join(parts)
        else:
            body = await reader.read()
            await self.close()
        at = time.perf_counter()
        if headers.get("connection", "").lower() == "close":
            await self.close()
        return Response(status, headers, body, at)

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            try:
                await self._writer.wait_closed()
            except ConnectionError:
                pass
        self._reader = self._writer = None
