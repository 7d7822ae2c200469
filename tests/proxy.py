"""A loopback TCP proxy in front of PostgreSQL that can freeze its connections (a half-open link)."""

from __future__ import annotations

import asyncio
import contextlib

from psycopg.conninfo import conninfo_to_dict, make_conninfo


class FreezableProxy:
    def __init__(self, upstream_dsn: str):
        self.upstream_dsn = upstream_dsn
        params = conninfo_to_dict(upstream_dsn)
        self._host = str(params.get("host") or "127.0.0.1")
        self._port = int(params.get("port") or 5432)
        self._frozen: set[asyncio.Task[None]] = set()
        self._pumps: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None
        self.port = 0

    async def _open_upstream(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self._host.startswith("/"):
            return await asyncio.open_unix_connection(f"{self._host}/.s.PGSQL.{self._port}")
        return await asyncio.open_connection(self._host, self._port)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        me = asyncio.current_task()
        try:
            while data := await reader.read(65536):
                while me in self._frozen:
                    await asyncio.sleep(3600)  # hold the bytes: the peer sees silence, not a close
                writer.write(data)
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        up_r, up_w = await self._open_upstream()
        for r, w in ((client_r, up_w), (up_r, client_w)):
            t = asyncio.create_task(self._pump(r, w))
            self._pumps.add(t)
            t.add_done_callback(self._pumps.discard)

    def freeze_existing(self) -> None:
        self._frozen |= set(self._pumps)

    def dsn(self) -> str:
        params = conninfo_to_dict(self.upstream_dsn)
        params.update(host="127.0.0.1", port=str(self.port))
        return make_conninfo("", **params)

    async def __aenter__(self) -> FreezableProxy:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for t in list(self._pumps):
            t.cancel()
        await asyncio.gather(*self._pumps, return_exceptions=True)
