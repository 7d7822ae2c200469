"""The ingress app with one extra bare endpoint, on the same hypercorn, for bench_sse's POST baseline, and a trace
of where each journal batch is on its way to the SSE clients (bench_sse's breakdown).

    python -m tests.bench.ingress_with_bare   (configured by the same environment as `petal-dispatch ingress`)

The trace (GET /bench/trace, then cleared): for each batch, by its last seq, when its notification reached the
listener (`received`), when its frames were encoded into the ring (`encoded`), and when each client's write of it
returned (`written`, one per client). Recording is an append of a tuple per step: a few microseconds a batch.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from hypercorn.asyncio import serve
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ingress import stream
from ingress.app import create_app
from ingress.main import hypercorn_config
from petal_dispatch import config, dbserver, ingress_wiring
from shared import listener

TRACE: dict[str, list[tuple[int, float]]] = {"received": [], "encoded": [], "written": []}
Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
ASGI = Callable[[Scope, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]], Awaitable[None]]


def _traced() -> None:
    received, publish = listener.Listener._publish, stream.Broadcaster._publish

    def on_note(self: listener.Listener, note: listener.Notification) -> None:
        head = note.payload.partition(" ")[0] if note.channel == "journal" else ""
        if head.isdigit():
            TRACE["received"].append((int(head), time.time()))
        received(self, note)

    def on_publish(self: stream.Broadcaster, frames: list[stream.Frame]) -> None:
        publish(self, frames)
        if frames and frames[-1].seq is not None:
            TRACE["encoded"].append((frames[-1].seq, time.time()))

    listener.Listener._publish = on_note  # type: ignore[method-assign]
    stream.Broadcaster._publish = on_publish  # type: ignore[method-assign]


def _written(app: ASGI) -> ASGI:
    """Each body write of /api/stream, by the last seq in it, once hypercorn took it."""
    async def wrapped(scope: Scope, receive: Callable[[], Awaitable[Message]],
                      send: Callable[[Message], Awaitable[None]]) -> None:
        if scope["type"] != "http" or scope["path"] != "/api/stream":
            return await app(scope, receive, send)

        async def sending(message: Message) -> None:
            await send(message)
            body = message.get("body", b"")
            at = body.rfind(b"id: ") if message["type"] == "http.response.body" else -1
            if at >= 0:  # the last frame's `id: <seq>` line (the data is compact JSON: no "id: " in it)
                digits = body[at + 4:].split(b"\r", 1)[0].split(b"\n", 1)[0]
                if digits.isdigit():
                    TRACE["written"].append((int(digits), time.time()))
        await app(scope, receive, sending)
    return wrapped


async def trace(request: Request) -> Response:
    out = {k: list(v) for k, v in TRACE.items()}
    for v in TRACE.values():
        v.clear()
    return JSONResponse(out)


async def bare(request: Request) -> Response:
    await request.json()
    return Response(b'{"status":"pending"}', status_code=202, media_type="application/json")


def main() -> None:
    settings = config.load()
    ingress = ingress_wiring.ingress_config(settings, dbserver.resolve(settings).ingress_dsn)
    app = create_app(ingress)
    app.router.routes.insert(0, Route("/bench/bare", bare, methods=["POST"]))
    app.router.routes.insert(0, Route("/bench/trace", trace))
    _traced()
    # hypercorn types the app with its own ASGI scope TypedDicts, starlette with a plain mapping
    asyncio.run(serve(_written(app), hypercorn_config(ingress)))  # type: ignore[arg-type]


if __name__ == "__main__":
    main()
