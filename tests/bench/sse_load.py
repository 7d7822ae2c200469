"""Load generator for bench_sse, run as its own process. Prints one JSON object on stdout.

    python -m tests.bench.sse_load clients URL PATH N EXPECT TIMEOUT
    python -m tests.bench.sse_load post URL PATH SECONDS CONCURRENCY
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

import httpx

from tests.web import sse_events


async def one_client(http: httpx.AsyncClient, path: str, expect: int, ready: asyncio.Event, counter: list[int],
                     lat: list[float], seqs: list[int]) -> None:
    async with http.stream("GET", path) as response:
        counter[0] += 1
        if counter[0] == counter[1]:
            ready.set()
        async for ev in sse_events(response):
            if ev.id is None:
                continue
            now = time.time()
            data = json.loads(ev.data)
            sent = (data.get("payload") or data)["t"]
            lat.append(now - sent)
            seqs.append(int(ev.id))
            if len(seqs) >= expect:
                return


async def clients(url: str, path: str, n: int, expect: int, timeout: float) -> dict[str, object]:
    limits = httpx.Limits(max_connections=n + 5, max_keepalive_connections=n + 5)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=httpx.Timeout(timeout, connect=30)) as http:
        ready = asyncio.Event()
        counter = [0, n]
        lats: list[list[float]] = [[] for _ in range(n)]
        seqs: list[list[int]] = [[] for _ in range(n)]
        tasks = [asyncio.create_task(one_client(http, path, expect, ready, counter, lats[i], seqs[i]))
                 for i in range(n)]
        await asyncio.wait_for(ready.wait(), 60)
        print(json.dumps({"ready": True}), flush=True)
        done, pending = await asyncio.wait(tasks, timeout=timeout)
        for t in pending:
            t.cancel()
    complete = sum(1 for s in seqs if len(s) >= expect and s == sorted(s) and len(set(s)) == len(s))
    return {"complete": complete, "clients": n, "latencies": [x for lat in lats for x in lat],
            "max_latency": max((max(lat) for lat in lats if lat), default=None)}


async def post(url: str, path: str, seconds: float, concurrency: int) -> dict[str, object]:
    ok = 0
    stop = time.monotonic() + seconds

    async def worker(http: httpx.AsyncClient, w: int) -> None:
        nonlocal ok
        i = 0
        while time.monotonic() < stop:
            i += 1
            r = await http.post(path, json={"text": f"bench {w}-{i}"})
            ok += r.status_code == 202
    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=30) as http:
        start = time.monotonic()
        await asyncio.gather(*(worker(http, w) for w in range(concurrency)))
        return {"ok": ok, "rps": ok / (time.monotonic() - start)}


def main() -> None:
    mode, url, path, *rest = sys.argv[1:]
    if mode == "clients":
        result = asyncio.run(clients(url, path, int(rest[0]), int(rest[1]), float(rest[2])))
    else:
        result = asyncio.run(post(url, path, float(rest[0]), int(rest[1])))
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
