"""Several ingress processes on one port (PETAL_INGRESS_REUSE_PORT): each binds it with SO_REUSEPORT, the kernel
spreads new connections over them, and every one of them streams the whole journal to its clients."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from psycopg_pool import AsyncConnectionPool

from petal_dispatch import ports
from shared import errors, journal
from shared.models import NewEvent
from tests.pg import DB
from tests.served import collect, free_port, ingress_server


async def test_two_ingresses_share_one_port_each_streams_every_event_and_one_stopping_leaves_the_other(
        db: DB) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    async with ingress_server(db.ingress_dsn, ingress_port=port, ingress_reuse_port=True):
        # a listener that shares the port is no reason to refuse a second one; without the setting it is
        ports.check_free("127.0.0.1", port, "ingress", shared=True)
        with pytest.raises(errors.ConfigError, match="the port is in use"):
            ports.check_free("127.0.0.1", port, "ingress")
        async with ingress_server(db.ingress_dsn, ingress_port=port, ingress_reuse_port=True), \
                AsyncConnectionPool(db.executor_dsn, min_size=1, max_size=2, kwargs={"autocommit": True}) as pool:
            clients = [httpx.AsyncClient(base_url=url, timeout=30) for _ in range(8)]
            try:
                ready = [asyncio.Event() for _ in clients]
                streams = [asyncio.create_task(collect(c, 5, ready=r)) for c, r in zip(clients, ready, strict=True)]
                await asyncio.wait_for(asyncio.gather(*(r.wait() for r in ready)), 30)  # each one subscribed
                await journal.append(pool, [NewEvent("task.stderr", {"n": i}) for i in range(5)])
                got = await asyncio.wait_for(asyncio.gather(*streams), 30)
            finally:
                for c in clients:
                    await c.aclose()
        assert all([e.event for e in events] == ["task.stderr"] * 5 for events in got), got
        assert all([int(e.id or 0) for e in events] == sorted(int(e.id or 0) for e in events) for events in got)
        # the second one stopped: the port still answers, through the first
        async with httpx.AsyncClient(base_url=url) as http:
            for _ in range(10):
                assert (await http.get("/healthz")).status_code == 200
