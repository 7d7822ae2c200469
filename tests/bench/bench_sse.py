"""SSE latency, fan-out capacity and POST throughput, each next to a baseline from the same run.

    python -m tests.bench.bench_sse

The ingress and a bare hypercorn fan-out server run as their own processes; the load generator
(tests/bench/sse_load.py) is a third; the appender (executor role) runs here.
(a) 10 SSE clients while 200 events/s are appended: append→client p50/p99, next to a bare
    LISTEN/NOTIFY round trip (goal: p99 within 10x; no client misses an event).
(b) 200 SSE clients: the highest append rate at which every client gets every event within 1 s, next
    to the same for the bare server streaming prebuilt frames from memory (goal >= 0.5 of it).
(c) POST /api/chat requests/s next to a bare starlette endpoint on the same hypercorn (goal >= 0.5).
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import psycopg
from psycopg_pool import AsyncConnectionPool

from shared import journal
from shared.models import NewEvent
from tests.pg import Cluster
from tests.web import free_port

RATES = [100, 200, 400, 800, 1600, 3200]
TRIAL_S = 3.0


def pct(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100)[q - 1] * 1000


async def wait_up(url: str, path: str = "/healthz") -> None:
    async with httpx.AsyncClient(base_url=url) as http:
        for _ in range(300):
            try:
                await http.get(path)
                return
            except httpx.TransportError:
                await asyncio.sleep(0.1)
    raise RuntimeError(f"{url} never came up")


async def append_at(pool: AsyncConnectionPool, rate: float, count: int) -> None:
    """`count` events at `rate` per second, in 10 ms batches; each payload carries its send time."""
    start = time.monotonic()
    sent = 0
    while sent < count:
        due = min(count, int((time.monotonic() - start) * rate) + 1)
        if due > sent:
            now = time.time()
            await journal.append(pool, [NewEvent("task.stderr", {"t": now, "n": i}) for i in range(sent, due)])
            sent = due
        await asyncio.sleep(0.01)


async def load(args: list[str], timeout: float) -> tuple[asyncio.subprocess.Process, asyncio.StreamReader]:
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "tests.bench.sse_load", *args,
                                                stdout=asyncio.subprocess.PIPE, limit=1 << 26)
    assert proc.stdout is not None
    return proc, proc.stdout


async def clients_trial(url: str, path: str, n: int, expect: int, start: Any) -> dict[str, Any]:
    proc, out = await load(["clients", url, path, str(n), str(expect), "120"], 120)
    line = await asyncio.wait_for(out.readline(), 90)
    assert json.loads(line)["ready"], line
    await start()
    result = json.loads(await asyncio.wait_for(out.readline(), 180))
    await proc.wait()
    return result


async def bare_notify_rtt(dsn: str, n: int = 300) -> list[float]:
    out = []
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as lis, \
            await psycopg.AsyncConnection.connect(dsn, autocommit=True) as snd:
        await lis.execute("LISTEN bench_rtt")
        gen = lis.notifies()
        for i in range(n):
            t = time.time()
            await snd.execute("SELECT pg_notify('bench_rtt', %s)", [str(i)])
            await anext(gen)
            out.append(time.time() - t)
            await asyncio.sleep(0.005)
        await gen.aclose()
    return out


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        cluster = Cluster.start(Path(tmp) / "pg")
        db = cluster.create_migrated()
        port, bare_port = free_port(), free_port()
        env = {**os.environ, "OPEN_MODE": "1", "PETAL_INGRESS_PORT": str(port), "PETAL_EXECUTOR_DSN": db.executor_dsn,
               "PETAL_INGRESS_DSN": db.ingress_dsn, "PETAL_LOG_LEVEL": "warning"}
        ingress = subprocess.Popen([sys.executable, "-m", "tests.bench.ingress_with_bare"], env=env)
        bare = subprocess.Popen([sys.executable, "-m", "tests.bench.bare_sse", str(bare_port)])
        url, bare_url = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{bare_port}"
        try:
            await wait_up(url)
            await wait_up(bare_url, "/")
            async with AsyncConnectionPool(db.executor_dsn, min_size=1, max_size=2, open=False) as pool:
                # (a) latency
                r = await clients_trial(url, "/api/stream", 10, 1000, lambda: append_at(pool, 200, 1000))
                rtt = await bare_notify_rtt(db.executor_dsn)
                print(f"(a) 10 clients, 200 events/s: {r['complete']}/10 clients got every event in order")
                print(f"    append->client p50 {pct(r['latencies'], 50):.1f} ms  p99 {pct(r['latencies'], 99):.1f} ms")
                print(f"    bare LISTEN/NOTIFY round trip p50 {pct(rtt, 50):.2f} ms  p99 {pct(rtt, 99):.2f} ms")
                print(f"    p99 ratio: {pct(r['latencies'], 99) / pct(rtt, 99):.1f}x  (goal <= 10x)")

                # (b) fan-out capacity
                async def capacity(stream_url: str, path: str, start_for: Any) -> int:
                    best = 0
                    for rate in RATES:
                        count = int(rate * TRIAL_S)
                        res = await clients_trial(stream_url, path, 200, count, start_for(rate, count))
                        ok = res["complete"] == 200 and (res["max_latency"] or 99) <= 1.0
                        print(f"    {stream_url} rate {rate}/s: {res['complete']}/200 complete, "
                              f"max latency {res['max_latency'] or float('nan'):.2f} s -> {'ok' if ok else 'no'}")
                        if not ok:
                            break
                        best = rate
                    return best

                async def bare_start(rate: int, count: int) -> None:
                    async with httpx.AsyncClient() as http:
                        await http.post(f"{bare_url}/publish?rate={rate}&count={count}")

                print("(b) 200 clients: highest rate with every event to every client within 1 s")
                ours = await capacity(url, "/api/stream", lambda rate, count: lambda: append_at(pool, rate, count))
                base = await capacity(bare_url, "/stream", lambda rate, count: lambda: bare_start(rate, count))
                print(f"    ingress: {ours}/s   bare in-memory fan-out: {base}/s   ratio {ours / base:.2f}"
                      "  (goal >= 0.5)")

            # (c) POST throughput
            chat = json.loads((await (await load(["post", url, "/api/chat", "4", "20"], 60))[1].readline()))
            bare_post = json.loads((await (await load(["post", url, "/bench/bare", "4", "20"], 60))[1].readline()))
            print(f"(c) POST /api/chat {chat['rps']:.0f} req/s   bare endpoint {bare_post['rps']:.0f} req/s   "
                  f"ratio {chat['rps'] / bare_post['rps']:.2f}  (goal >= 0.5)")
        finally:
            for p in (ingress, bare):
                p.terminate()
                p.wait(10)
            cluster.drop_all()


if __name__ == "__main__":
    asyncio.run(main())
