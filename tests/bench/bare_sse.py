"""The baseline for fan-out: a bare hypercorn app streaming prebuilt frames from memory.

    python -m tests.bench.bare_sse PORT
GET /stream to listen; POST /publish?rate=R&count=N to send N frames at R frames/s to every listener.
POST /bare answers 202 with a fixed body (the baseline for POST /api/chat is in bench_sse itself).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

from hypercorn.asyncio import serve
from hypercorn.config import Config
from hypercorn.typing import ASGIReceiveCallable, ASGISendCallable, Scope

listeners: set[asyncio.Queue[bytes]] = set()
publishing: set[asyncio.Task[None]] = set()


async def app(scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
    if scope["type"] == "lifespan":
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif msg["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    path = scope["path"]
    if path == "/stream":
        queue: asyncio.Queue[bytes] = asyncio.Queue()
        listeners.add(queue)
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})
        await send({"type": "http.response.body", "body": b": hi\n\n", "more_body": True})
        # hypercorn drops sends to a closed connection silently: without watching for the disconnect, a
        # gone client's handler would live on and cost every later trial its share of the fan-out
        gone = asyncio.ensure_future(_disconnected(receive))
        try:
            while not gone.done():
                got = asyncio.ensure_future(queue.get())
                await asyncio.wait({got, gone}, return_when=asyncio.FIRST_COMPLETED)
                if not got.done():
                    got.cancel()
                    break
                frames = [got.result()]
                while not queue.empty():  # what piled up goes in one write, as the ingress does
                    frames.append(queue.get_nowait())
                await send({"type": "http.response.body", "body": b"".join(frames), "more_body": True})
        finally:
            gone.cancel()
            listeners.discard(queue)
    elif path == "/publish":
        q = dict(p.split("=") for p in scope["query_string"].decode().split("&"))
        rate, count = float(q["rate"]), int(q["count"])
        for old in publishing:  # a trial that fell behind must not leak frames into the next one
            old.cancel()
        task = asyncio.create_task(_publish(rate, count))
        publishing.add(task)
        task.add_done_callback(publishing.discard)
        await send({"type": "http.response.start", "status": 202, "headers": []})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _disconnected(receive: ASGIReceiveCallable) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _publish(rate: float, count: int) -> None:
    """`count` frames at `rate` per second in 10 ms ticks, each tick's frames in one put: the same batching
    as the benchmark's appender gives the ingress (10 ms journal batches, one NOTIFY each)."""
    start = time.monotonic()
    sent = 0
    while sent < count:
        due = min(count, int((time.monotonic() - start) * rate) + 1)
        if due > sent:
            now = time.time()
            frames = b"".join(f"id: {i}\nevent: x\ndata: {json.dumps({'seq': i, 't': now})}\n\n".encode()
                              for i in range(sent + 1, due + 1))
            for queue in list(listeners):
                queue.put_nowait(frames)
            sent = due
        await asyncio.sleep(0.01)


if __name__ == "__main__":
    config = Config()
    config.bind = [f"127.0.0.1:{sys.argv[1]}"]
    config.accesslog = None
    asyncio.run(serve(app, config))
