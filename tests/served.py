"""A real hypercorn on loopback serving the ingress, and a small SSE reader over real HTTP."""

from __future__ import annotations

import asyncio
import os
import random
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from typing import Any

import httpx

from ingress.main import serve
from petal_dispatch import config, ingress_wiring
from tests.wait import until

# Ports for the services a test starts come from below the kernel's ephemeral range (32768 and up), where
# outgoing connections take theirs: a port the kernel hands out as free can be taken by a connection before
# the service binds it. Each xdist worker has a slice of its own; within it, ports are handed out in turn.
PORTS_FROM, PORTS_PER_WORKER, WORKER_SLICES = 20_000, 2_000, 6
_handed: list[int] = []


def _slice_start() -> int:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    n = int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else WORKER_SLICES - 1
    return PORTS_FROM + (n % WORKER_SLICES) * PORTS_PER_WORKER


def free_port() -> int:
    """A loopback port nobody listens on, not handed out before in this process."""
    start = _slice_start()
    offset = _handed[-1] - start + 1 if _handed else random.randrange(PORTS_PER_WORKER)
    for i in range(PORTS_PER_WORKER):
        port = start + (offset + i) % PORTS_PER_WORKER
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue  # another process of the machine has it
        _handed.append(port)
        return port
    raise RuntimeError(f"no free port in {start}..{start + PORTS_PER_WORKER - 1}")


async def answering(url: str, path: str, serving: asyncio.Future[Any]) -> None:
    """Until `path` answers 200 (failing after 30 s), or the server's task ended (its error raised)."""
    async with httpx.AsyncClient(base_url=url, timeout=5) as probe:
        async def answers() -> bool:
            if serving.done():
                serving.result()
            try:
                return (await probe.get(path)).status_code == 200
            except httpx.TransportError:
                return False
        await until(answers, f"{url}{path} answering", timeout=30, every=0.05)


@asynccontextmanager
async def ingress_server(dsn: str, **settings_kw: Any) -> AsyncIterator[str]:
    """The ingress on `dsn`, configured as `petal-dispatch ingress` would be by these settings (open mode and a
    free port unless given); its URL once it answers."""
    settings_kw.setdefault("open_mode", True)
    settings_kw.setdefault("ingress_port", free_port())
    settings = config.Settings(ingress_host="127.0.0.1", **settings_kw)
    ingress = replace(ingress_wiring.ingress_config(settings, dsn), graceful_timeout_s=1.0)
    stop = asyncio.Event()
    task = asyncio.create_task(serve(ingress, stop))
    url = f"http://127.0.0.1:{ingress.port}"
    await answering(url, "/healthz", task)
    try:
        yield url
    finally:
        stop.set()
        await asyncio.wait_for(task, 20)


@dataclass
class SSEEvent:
    id: str | None
    event: str
    data: str


async def sse_events(response: httpx.Response) -> AsyncIterator[SSEEvent]:
    ev_id: str | None
    data: list[str]
    ev_id, ev_name, data = None, "message", []
    async for line in response.aiter_lines():
        if line == "":
            if data:
                yield SSEEvent(ev_id, ev_name, "\n".join(data))
            ev_id, ev_name, data = None, "message", []
        elif line.startswith(":"):
            continue
        else:
            field, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if field == "id":
                ev_id = value
            elif field == "event":
                ev_name = value
            elif field == "data":
                data.append(value)


async def collect(client: httpx.AsyncClient, n: int, headers: dict[str, str] | None = None,
                  params: dict[str, str] | None = None, ready: asyncio.Event | None = None,
                  only_ids: bool = True, timeout: float = 30, got: list[SSEEvent] | None = None) -> list[SSEEvent]:
    """Read the stream until n events (with ids) arrived (into `got` when given: the caller can watch them come)."""
    got = [] if got is None else got
    async with client.stream("GET", "/api/stream", headers=headers, params=params, timeout=timeout) as response:
        assert response.status_code == 200, await response.aread()
        if ready is not None:
            ready.set()
        async for ev in sse_events(response):
            if only_ids and ev.id is None:
                continue
            got.append(ev)
            if len(got) >= n:
                break
    return got
