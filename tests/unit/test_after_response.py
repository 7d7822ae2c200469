"""Work a request leaves for after its response runs once the response is sent, whatever became of it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from hypercorn.asyncio import serve
from hypercorn.config import Config
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from shared import after_response
from tests.served import answering, free_port
from tests.wait import one_step


class _Seen:
    def __init__(self) -> None:
        self.order: list[str] = []
        self.futures: list[asyncio.Future[None]] = []
        self.ran = asyncio.Event()


def _marks_sent(app: ASGIApp, seen: _Seen) -> ASGIApp:
    """Between the middleware and the app: notes the moment the response's last part went out."""
    async def marked(scope: Scope, receive: Receive, send: Send) -> None:
        async def sending(message: Any) -> None:
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                seen.order.append("sent")
        await app(scope, receive, sending)
    return marked


def _app(seen: _Seen) -> Starlette:
    async def work(name: str) -> None:
        seen.order.append(name)
        if name == "fails":
            raise RuntimeError("this one fails")
        if name == "last":
            seen.ran.set()

    async def reply(request: Request) -> Response:
        for name in ("first", "fails", "last"):
            seen.futures.append(after_response.defer(lambda name=name: work(name)))  # type: ignore[misc]
        seen.order.append("handler")
        for _ in range(5):
            await one_step()  # room for anything started now to run before the response
        return PlainTextResponse("ok")

    async def hang(request: Request) -> Response:
        seen.futures.append(after_response.defer(lambda: work("last")))
        seen.order.append("handler")
        # the client leaves before an answer: the app ends with nothing sent, as the MCP SDK's request does
        # when it sees the disconnect (it cancels the tool's call)
        while (await request.receive())["type"] != "http.disconnect":
            pass
        raise asyncio.CancelledError

    return Starlette(routes=[Route("/reply", reply), Route("/hang", hang)])


@asynccontextmanager
async def _served(app: ASGIApp) -> AsyncIterator[str]:
    config = Config()
    port = free_port()
    config.bind = [f"127.0.0.1:{port}"]
    config.graceful_timeout = 0.5
    stop = asyncio.Event()
    task = asyncio.ensure_future(serve(app, config, shutdown_trigger=stop.wait))  # type: ignore[arg-type]
    url = f"http://127.0.0.1:{port}"
    await answering(url, "/reply", task)
    try:
        yield url
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


@pytest.mark.parametrize("deferred", [True, False])
async def test_the_work_runs_in_order_after_the_response_went_and_an_error_stays_its_own(deferred: bool) -> None:
    seen = _Seen()
    app = _marks_sent(_app(seen), seen)
    async with _served(after_response.AfterResponse(app) if deferred else app) as url, \
            httpx.AsyncClient(base_url=url) as http:
        await seen.ran.wait()  # the probe's request
        seen.order.clear()
        seen.futures.clear()
        seen.ran.clear()
        assert (await http.get("/reply")).text == "ok"
        await asyncio.wait_for(seen.ran.wait(), 5)
        await asyncio.wait(seen.futures, timeout=5)
    if deferred:
        assert seen.order == ["handler", "sent", "first", "fails", "last"]
    else:  # the control: without the middleware the same work runs at once, ahead of the response
        assert seen.order.index("first") < seen.order.index("sent")
    first, fails, last = seen.futures
    assert first.result() is None and last.result() is None
    assert isinstance(fails.exception(), RuntimeError)


async def test_the_work_of_a_request_its_client_left_still_runs_and_later_work_runs_at_once() -> None:
    seen = _Seen()
    async with _served(after_response.AfterResponse(_app(seen))) as url, httpx.AsyncClient(base_url=url) as http:
        await seen.ran.wait()
        seen.order.clear()
        seen.ran.clear()
        with pytest.raises(httpx.ReadTimeout):
            await http.get("/hang", timeout=0.3)
        await asyncio.wait_for(seen.ran.wait(), 10)  # hypercorn cancels the handler; its work goes on
    assert seen.order == ["handler", "last"]
    assert not after_response.in_request()
    outside = after_response.defer(one_step)
    await asyncio.wait_for(outside, 5)
